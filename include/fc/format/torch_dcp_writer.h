// Writing PyTorch Distributed Checkpoints (DCP, FileSystemWriter layout) that real torch
// `load_state_dict` accepts, for the torch 1.13 and the 2.x (~2.3+) metadata generations.
// The reader is fc/format/torch_dcp.h; shared/reference/formats.md sections 2 and 3 are the
// format references.
//
// Byte layout written:
//   1. <out_dir>/__<rank>_<n>.distcp, one per plan file: items back to back, each a
//      complete torch.save archive (zip offsets relative to the item's first byte):
//        - first the file's objects, in plan order (BYTE_IO items): the caller's bytes,
//          verbatim (they must already be a torch.save zip, ObjectEncoding::kTorchSave);
//        - then the file's chunks with replica_id == 0, in plan order, each the archive
//            local header "archive/data.pkl"   + FB padding   (data at +64)
//            data.pkl       protocol 2:
//                           REDUCE(torch._utils._rebuild_tensor_v2,
//                                  (BINPERSID(('storage', torch.<X>Storage, '0', 'cpu', numel)),
//                                   0, sizes, row-major strides, False, OrderedDict()))
//                           or, for float8 dtypes (2.x only), _rebuild_tensor_v3 with
//                           torch.UntypedStorage (numel = bytes) and the dtype as 7th arg
//            descriptor, "archive/byteorder" = "little", descriptor,
//            "archive/data/0"   the chunk's elements, row-major, little-endian, packed,
//                               starting at a multiple of 64 inside the item
//            descriptor, "archive/version" = "3\n", descriptor,
//            central directory (real sizes and CRC-32s), zip64 EOCD record + locator, EOCD
//          (the container details, zip64 fields for records >= 4 GiB included, are those
//          of fc/codec/zip_writer.h, i.e. what torch's miniz writes).
//      With TorchDcpSerialization::kSafetensors the chunks are instead one safetensors blob
//      after the objects (see the enum).
//      Every item's size follows from the plan alone, so every offset is fixed at Create and
//      chunk bytes are written (pwrite) straight to their final position.
//   2. <out_dir>/.metadata, pickle protocol 4, written last:
//        Metadata{state_dict_metadata: {fqn: TensorStorageMetadata | BytesStorageMetadata},
//                 planner_data, storage_data: {MetadataIndex: _StorageInfo}[, storage_meta]
//                 [, version]}
//      with, per generation (formats.md 2.3):
//                        k1_13                   k2_0 (2.0-2.3)        k2 (2.4+)
//        classes         torch.distributed.      torch.distributed.    as k2_0
//                          _shard.checkpoint.      checkpoint.metadata /
//                          metadata / .filesystem  .filesystem
//        TensorProperties torch.distributed.     as k1_13 (enum by     torch.distributed.
//                          _shard.sharded_tensor.  value)                checkpoint.metadata
//                          metadata (+ MEM_FORMAT_                       (+ _MEM_FORMAT_ENCODING,
//                          ENCODING, by name)                            by value)
//        planner_data    None                    {fqn: (fqn,)}         {fqn: (fqn,)}
//        storage_meta    absent                  absent                StorageMeta{checkpoint_id:
//                                                                        pathlib.PosixPath(*parts
//                                                                        of out_dir as given),
//                                                                        save_id: str(uuid4()),
//                                                                        load_id: None,
//                                                                        modules: []}
//        version         absent                  absent                "1.0.0"
//      Tensors are listed in plan order, then objects in file order. A tensor's chunks are
//      listed in file order, then in their order within the file; MetadataIndex.index is
//      that position. _StorageInfo.relative_path is the file name.
//
// Atomicity: everything is built in a sibling staging directory
// "<out_dir>.fc-tmp-<pid>-XXXXXX" (CreateStagingDir, fc/io/output_dir.h); Finish fsyncs
// every file, writes and fsyncs .metadata, and commits the staging directory onto out_dir
// (CommitStagingDir). A failed or abandoned writer removes the staging directory it owns
// (a writer on a shared one removes only its own files; the directory's creator removes
// the rest): nothing that looks like a complete checkpoint is
// ever left.
//
// CRC-32 of the data/0 records: each slab passed to WriteChunk is CRC'd as it is written;
// adjacent slabs are merged with crc32_combine as they meet, so a complete chunk holds one
// CRC whatever the arrival order, and Finish never re-reads tensor bytes.
//
// Thread-safety: WriteChunk and WriteObject may be called concurrently from several threads
// (also for the same file or chunk, on disjoint bytes); Create, FinishDataFiles,
// CommitMetadata, Finish and Abort must not race with anything.
#ifndef FC_FORMAT_TORCH_DCP_WRITER_H_
#define FC_FORMAT_TORCH_DCP_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/fc_distcp.h"

namespace fc {

// Which torch releases' FileSystemReader the .metadata is for (formats.md 2.3, 2.6):
//   k1_13  torch 1.13 (torch.distributed._shard.checkpoint);
//   k2_0   torch 2.0-2.3: torch.distributed.checkpoint classes, TensorProperties and
//          MEM_FORMAT_ENCODING from torch.distributed._shard.sharded_tensor.metadata, the
//          three original Metadata fields only (2.0-2.3 cannot unpickle StorageMeta); every
//          later 2.x loads it too;
//   k2     torch 2.4+: TensorProperties and _MEM_FORMAT_ENCODING from
//          torch.distributed.checkpoint.metadata, plus storage_meta and version "1.0.0", as
//          current FileSystemWriter writes them.
enum class TorchGeneration { k1_13, k2_0, k2 };

// How tensor items are stored (torch's SerializationFormat, ~2.8+).
enum class TorchDcpSerialization {
  kTorchSave,   // each chunk its own torch.save archive (every torch release)
  // After the file's objects, one safetensors blob of its chunks keyed by fqn (one chunk per
  // tensor per file, k2 only), header padded with spaces to a multiple of 8, __metadata__
  // {"DCP_SHARDING_INFO": json({fqn: {"saved_offsets": [...]}}), "DCP_VERSION": "1.0",
  // "format": "pt"}; each chunk's _StorageInfo has offset = the blob's start and length =
  // its data bytes, as torch writes them. torch's own FileSystemReader does not read this
  // form (its HF reader and fc do).
  kSafetensors,
};

struct TorchDcpWriteOptions {
  TorchGeneration generation = TorchGeneration::k2;
  TorchDcpSerialization serialization = TorchDcpSerialization::kTorchSave;
  // Several processes writing one checkpoint, as with FcDistcpWriter (fc_distcp.h): every
  // process creates a writer with the same plan, its own `files` (indices into plan.files;
  // empty = all) and the `staging_dir` one of them made with CreateFcDistcpStagingDir
  // (empty = the writer makes and owns one). Each calls FinishDataFiles; then exactly one
  // calls CommitMetadata. A writer on a shared staging directory never removes it.
  std::vector<size_t> files;
  std::string staging_dir;
};

// Where one chunk or object lives in the written files (from the plan alone).
struct TorchDcpItemPlacement {
  uint64_t item_offset = 0;  // first byte of the item's torch.save archive in its file
  uint64_t item_length = 0;  // archive bytes
  uint64_t data_offset = 0;  // absolute file offset of the chunk's first element / object
  uint64_t data_length = 0;  // chunk elements * itemsize / object bytes
  bool written = true;       // false: a chunk with replica_id > 0 (not stored)
};

struct TorchDcpFileLayout {
  std::vector<TorchDcpItemPlacement> chunks;   // plan order
  std::vector<TorchDcpItemPlacement> objects;  // plan order
  uint64_t file_size = 0;
  // TorchDcpSerialization::kSafetensors only: the blob's first byte and its u64 length +
  // JSON header (data follows).
  uint64_t blob_offset = 0;
  std::string blob_header;
};

// Checks a plan for DCP (kInvalidArgument naming the offending item): file names
// "__<rank>_<n>.distcp" (canonical decimals) and unique; tensor keys unique, non-empty,
// valid UTF-8, and distinct from object keys (DCP has one namespace of fqns); every chunk's
// key is a tensor; boxes inside their tensor; no flat_range; replica_id >= 0; the chunks
// with replica_id 0 of each tensor do not overlap, start at distinct offsets, and cover the
// tensor exactly; objects have encoding kTorchSave and a non-zero length; dtypes exist in
// the generation (no float8 for k1_13); sizes do not overflow; with the SAFETENSORS
// serialization: generation k2 and one stored chunk per tensor per file. (Create also refuses
// with k2 an out_dir that is not UTF-8: it becomes storage_meta.checkpoint_id.)
Status ValidateTorchDcpPlan(const FcDistcpPlan& plan, TorchDcpWriteOptions options = {});

// Item placement for every file of a (valid) plan. Errors: ValidateTorchDcpPlan's.
Result<std::vector<TorchDcpFileLayout>> ComputeTorchDcpLayouts(const FcDistcpPlan& plan,
                                                               TorchDcpWriteOptions options = {});

class TorchDcpWriter {
 public:
  // plan.files[i].name must be "__<rank>_<n>.distcp". Chunks with a flat_range are
  // kInvalidArgument (DCP stores n-d boxes only); chunks with replica_id > 0 are not
  // stored (DCP stores each element once) and their WriteChunk bytes are accepted and
  // dropped. Objects must have encoding kTorchSave: their bytes are a complete torch.save
  // zip, stored verbatim as a BYTE_IO item.
  // Errors: ValidateTorchDcpPlan's; kInvalidArgument for an options.files index out of
  // range; CreateFcDistcpStagingDir's (kFailedPrecondition when out_dir exists and is not an
  // empty directory); kIoError.
  static Result<std::unique_ptr<TorchDcpWriter>> Create(const std::string& out_dir,
                                                        FcDistcpPlan plan,
                                                        TorchDcpWriteOptions options = {});
  ~TorchDcpWriter();
  TorchDcpWriter(const TorchDcpWriter&) = delete;
  TorchDcpWriter& operator=(const TorchDcpWriter&) = delete;

  const std::string& out_dir() const { return out_dir_; }
  const std::string& staging_dir() const { return staging_dir_; }
  const FcDistcpPlan& plan() const { return plan_; }
  const std::vector<TorchDcpFileLayout>& layouts() const { return layouts_; }

  // Writes `bytes` at `offset` (bytes, within the chunk's packed row-major data) of chunk
  // `chunk` of plan file `file`. Slabs may come in any order and from any thread; each byte
  // exactly once. Errors: kInvalidArgument for an index or range out of bounds, a file this
  // writer does not write, or bytes written twice; kFailedPrecondition after
  // FinishDataFiles/Finish/Abort; kIoError (the writer is then poisoned: Finish fails).
  Status WriteChunk(size_t file, size_t chunk, uint64_t offset, std::span<const std::byte> bytes);
  // The same for object `object` (offset within the object's bytes). The slab holding byte 0
  // must start with the zip signature "PK\3\4" (kInvalidArgument otherwise).
  Status WriteObject(size_t file, size_t object, uint64_t offset,
                     std::span<const std::byte> bytes);

  // For this writer's files: checks that every byte is present (kFailedPrecondition naming
  // the first incomplete chunk or object: file, key, box, missing byte range), writes the
  // archive headers, fsyncs and closes the files. On error the writer is aborted.
  Status FinishDataFiles();

  // After every writer's FinishDataFiles: checks that every plan file is in the staging
  // directory with its planned size (kDataLoss), writes and fsyncs .metadata, and renames
  // the staging directory to out_dir (kFailedPrecondition when out_dir has appeared and is
  // not empty; kIoError). On error this writer is aborted; a shared staging directory is
  // left for its creator to remove (AbortFcDistcpStaging).
  Status CommitMetadata();

  // FinishDataFiles + CommitMetadata, for a single writer of the whole plan.
  Status Finish();

  // Closes and removes this writer's files, and the staging directory if it owns it.
  // Idempotent; no-op after a successful CommitMetadata. Before FinishDataFiles the
  // destructor aborts; after it, a writer on a shared staging directory leaves its files
  // for the committing process.
  void Abort();

 private:
  struct ItemState;
  struct FileState;
  TorchDcpWriter();
  Status WriteItem(size_t file, bool is_object, size_t index, uint64_t offset,
                   std::span<const std::byte> bytes);
  Status FinishFile(size_t file);
  Result<std::string> MetadataPickle() const;
  std::string StateName() const;  // what ended the open state, for error messages

  std::string out_dir_;
  std::string staging_dir_;
  FcDistcpPlan plan_;
  TorchDcpWriteOptions options_;
  std::vector<TorchDcpFileLayout> layouts_;
  bool owns_staging_ = false;
  std::vector<std::unique_ptr<FileState>> files_;  // null for files another writer writes
  enum class State { kOpen, kDataFinished, kCommitted, kAborted } state_ = State::kOpen;
};

}  // namespace fc

#endif  // FC_FORMAT_TORCH_DCP_WRITER_H_
