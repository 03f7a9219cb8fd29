// PyTorch Distributed Checkpoint (DCP), FileSystemWriter layout, torch 1.13 and 2.x:
// reading `.metadata` and locating every chunk's bytes, producing a CheckpointIndex.
//
// Byte layout (shared/reference/formats.md section 2):
//   1. <dir>/.metadata: a pickle (protocol 4+, fc/codec/pickle.h) of
//        Metadata  {state_dict_metadata: {fqn: TensorStorageMetadata | BytesStorageMetadata},
//                   planner_data: Any, storage_data: {MetadataIndex: _StorageInfo},
//                   [storage_meta: StorageMeta], [version: str], [extra attributes, e.g.
//                   Megatron's mcore_data]}
//        TensorStorageMetadata {properties: TensorProperties, size: torch.Size,
//                               chunks: [ChunkStorageMetadata {offsets: Size, sizes: Size}]}
//        TensorProperties  state = (dtype, layout, requires_grad, memory_format, pin_memory)
//                          dtype = GLOBAL torch.<name>; memory_format = an enum member
//                          pickled by value  REDUCE(EnumCls, (0,))  or by name
//                          REDUCE(builtins.getattr, (EnumCls, 'TORCH_CONTIGUOUS_FORMAT'))
//        MetadataIndex     {fqn: str, offset: Size | None (None for bytes), index: int | None}
//        _StorageInfo      {relative_path: str, offset: int, length: int,
//                           [transform_descriptors: [str]]}
//        StorageMeta       {checkpoint_id: str | PosixPath | None, save_id, load_id, [modules]}
//      Dataclasses are NEWOBJ + BUILD(dict); module paths differ by release:
//        1.13:  torch.distributed._shard.checkpoint.{metadata,filesystem},
//               torch.distributed._shard.sharded_tensor.metadata (TensorProperties, enum)
//        2.x:   torch.distributed.checkpoint.{metadata,filesystem} (TensorProperties moved
//               there in ~2.3, enum renamed _MEM_FORMAT_ENCODING).
//      Missing fields take the class default; unknown fields are kept as extra_fields.
//   2. <dir>/<relative_path> (usually __<rank>_<n>.distcp): items back to back; item bytes
//      [offset, offset + length) are one complete torch.save archive (fc/format/torch_save.h)
//      whose zip offsets are relative to the item start. A tensor item holds one tensor of
//      shape chunk.sizes (possibly strided, possibly with a storage_offset); a bytes item
//      holds any pickled object.
//   3. Chunk -> item: the storage_data key with the same fqn and offset == chunk.offsets.
//   4. Saves without rank coordination (torch ~2.8+, use_collectives=False): no .metadata,
//      one __<rank>.metadata per rank holding only that rank's items (global sizes, its own
//      save_id, index hints numbered within the rank); the checkpoint is their union (see
//      ReadTorchDcp).
//
//   5. Stream transforms (~2.7+): an item whose _StorageInfo has transform_descriptors
//      ["stream.zstd/1"] is stored zstd-compressed (fc/format/torch_dcp_transform.h); its
//      chunk/object gets Chunk::encoded_item and places inside the decoded item.
//   6. SerializationFormat.SAFETENSORS (~2.8+): a data file holds the byte items (torch.save
//      archives) and then one safetensors blob running to the file's end, keyed by fqn, with
//      __metadata__ DCP_SHARDING_INFO {fqn: {"saved_offsets": [...]}}; every tensor's
//      _StorageInfo has offset = blob start and length = its byte size, which locate nothing.
//      Tensor items sharing a start are recognised as a blob (one probe read at open: not a
//      zip local header, '{' after the u64 length); each chunk is located through the blob's
//      header, checking saved_offsets, dtype, shape and byte size.
//   Items of torch >= 2.0 carry a "byteorder" record; "big" is refused (kUnimplemented).
//
// Not supported (kUnimplemented): other or stacked transforms (named), big-endian items,
// non-strided layouts, dtypes fc lacks.
//
// Thread-safety: pure functions; ReadTorchDcp opens its own files.
#ifndef FC_FORMAT_TORCH_DCP_H_
#define FC_FORMAT_TORCH_DCP_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/codec/pickle.h"
#include "fc/format/open_problems.h"
#include "fc/io/file.h"

namespace fc {

class TorchTensorRefCache;  // fc/format/torch_save.h

struct DcpChunkMetadata {
  Shape offsets;
  Shape sizes;
};

struct DcpItemMetadata {
  std::string fqn;
  bool is_tensor = false;  // false: BytesStorageMetadata
  // Tensor items only:
  DType dtype = DType::kFloat32;
  Shape size;
  std::vector<DcpChunkMetadata> chunks;
  bool requires_grad = false;
  // "TORCH_CONTIGUOUS_FORMAT" etc., from either enum form; empty if not recognised.
  std::string memory_format;
};

struct DcpStorageInfo {
  // The MetadataIndex key.
  std::string fqn;
  std::optional<Shape> chunk_offsets;  // MetadataIndex.offset; nullopt for bytes items
  std::optional<int64_t> index;        // MetadataIndex.index (a hint)
  // The _StorageInfo value.
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transform_descriptors;
};

struct DcpMetadata {
  std::string generation;  // "1.13" or "2", from the module path of the Metadata class
  std::vector<DcpItemMetadata> items;     // state_dict_metadata, in file order
  std::vector<DcpStorageInfo> storage;    // storage_data, in file order
  std::optional<std::string> version;     // Metadata.version ("1.0.0" in ~2.6+)
  std::optional<std::string> checkpoint_id;  // storage_meta.checkpoint_id (paths joined)
  std::optional<std::string> save_id;
  PickleValue::Ptr planner_data;  // null when None or absent
  PickleValue::Ptr mcore_data;    // Megatron-core extra attribute; null when absent
  std::vector<std::string> extra_fields;  // Metadata attributes fc does not know
};

// Interprets a `.metadata` pickle. Accepts the union of the 1.13 and 2.x variants: both
// module path sets, both enum pickling forms, PosixPath from pathlib or pathlib._local,
// missing optional fields, unknown extra fields.
// Errors: kDataLoss for a malformed pickle or structure (the message names the fqn and the
// offending value), duplicate fqns or storage keys, negative or non-integer sizes;
// kUnimplemented when the root is not a torch DCP Metadata (e.g. Paddle's), for
// unsupported dtypes / layouts, and for unsupported pickle features.
Result<DcpMetadata> ParseDcpMetadata(std::span<const std::byte> bytes);

struct TorchDcpReadOptions {
  // true: read every item's zip directory and data.pkl at open (two small reads per chunk)
  // and fill byte_offset/byte_length/strides; a corrupt item fails the open.
  // false: read no item at open. Each chunk gets `unlocated_item` and the item's range as
  // its byte range (fc/model/checkpoint_index.h); ChunkReader (fc/format/chunk_reader.h)
  // locates the data on first read with LocateTorchDcpChunk, and a corrupt item is reported
  // then (with the same message) or by fc-inspect --verify. OpenCheckpoint uses false.
  bool locate_chunks = true;
  // Lenient opening for verification (fc/format/open_problems.h), with locate_chunks false:
  // items past the end of their file are kept as the metadata gives them (VerifyCheckpoint
  // fails to locate them, or finds an object's range past the end), and recorded instead
  // of failing: an object whose torch.save archive is corrupt, items that overlap, a
  // shared-start probe that cannot be read, a data file that cannot be opened (its items
  // are left out of the index). Still errors: everything in .metadata, chunk boxes outside
  // their tensor, unsupported transforms.
  OpenProblems* lenient = nullptr;
};

// The rank R of a per-rank metadata file name "__R.metadata" (R decimal), else nullopt.
std::optional<uint64_t> TorchDcpRankMetadataRank(std::string_view name);

// Reads a torch DCP checkpoint directory into a CheckpointIndex. The metadata is
// <dir>/.metadata or, when that is absent, the union of every <dir>/__R.metadata (rank
// order): an fqn must have the same kind, dtype and global size in every file that lists
// it (kDataLoss naming both files otherwise); a chunk box that an earlier file already
// stores becomes a replica (Chunk::replica_id = number of earlier files storing it); the
// same chunk offsets with other sizes is kDataLoss naming both files; a bytes item is read
// from the first file listing it. Result:
//   format kTorchDcp; root = dir; files = every data file referenced, sorted by (rank, n)
//   for __R_N.distcp names, with sizes; tensors in .metadata order, one Chunk per
//   ChunkStorageMetadata (located: byte_offset = absolute position of the first element of
//   the view in the file, byte_length = bytes from there to the view's last element, strides
//   set when the stored view is not packed row-major; see options.locate_chunks); objects =
//   the bytes items (encoding kTorchSave, byte range = the item's archive; their zip
//   directory is always checked at open); attributes: "torch_generation" ("1.13" /
//   "2"), "rank_local_metadata" (the __R.metadata names, when those were read), and when
//   present (in the first metadata file) "dcp_version", "checkpoint_id", "save_id", "mcore_data"
//   (entry count), "mcore_data.<key>.nd_reformulated_orig_global_shape" (for keys that
//   name no tensor),
//   "metadata_extra_fields", "megatron_metadata_json", "megatron_common_pt" (Megatron's
//   dist checkpointing: common.pt, a torch.save of the state dict's unsharded rest, parsed
//   as data for "megatron.iteration", "megatron.optimizer_step", the param groups' "step"
//   values under "optimizer", and "megatron.optimizer_sharding_type"; "read: ..." or
//   "present, not read: <why>", never an error), "megatron.reformulated".
// Megatron-Core before 0.14 saved flattened-range ShardedTensors (the distributed
// optimizer's per-param states) "N-D reformulated": shape axis_fragmentations + (fragment
// numel,), chunks at (fragment index..., range start) of sizes (1, ..., 1, range length),
// the original shape in mcore_data[key]["nd_reformulated_orig_global_shape"]. Such a tensor
// is given its original shape, each chunk its fragment's box with the range as flat_range
// ("megatron.reformulated" counts them); a shape that does not fit is kDataLoss.
// Cost: the .metadata parse, hash lookups per chunk, a sort of the item ranges per file;
// with locate_chunks, a few small reads per chunk.
// Errors (message: "<file>: tensor '<fqn>' chunk <box>: <what>"):
//   kNotFound   dir missing, neither .metadata nor any __R.metadata, a referenced data
//               file missing;
//   kDataLoss   corrupt .metadata or item, item range outside its file, overlapping items,
//               storage record smaller than the view, chunk box outside the tensor, item
//               shape != chunk sizes, item dtype != metadata dtype, chunk without storage,
//               relative_path escaping dir;
//   kUnimplemented  see the list above;
//   kIoError    read failures.
Result<CheckpointIndex> ReadTorchDcp(const std::string& dir,
                                     const TorchDcpReadOptions& options = {});

// Locates the data of a chunk that ReadTorchDcp left unlocated (chunk.unlocated_item set;
// [chunk.byte_offset, + byte_length) is its item inside `file`, whose name relative to the
// checkpoint is `file_name`): reads the item's zip directory and data.pkl (two small reads,
// one for items up to 16 KiB) and checks the item's dtype and shape against the chunk.
// Errors: those of ReadTorchDcp for a corrupt item, with the same messages
// ("<file_name>: tensor '<key>' chunk <box>: item bytes [a, b): ...").
// `item_prefix`: the item's first bytes when the caller has read them already (the file's
// bytes [chunk.byte_offset, + item_prefix.size()); not checked against the file): the
// reads that fall inside them are served from memory (fc/ops/locate_chunks.h reads many
// small items with one read). Not used for encoded items. `refs`: decodes of data.pkl texts
// seen before (torch_save.h), for callers that locate many chunks on one thread.
Result<ChunkLocation> LocateTorchDcpChunk(const RandomAccessFile& file,
                                          const std::string& file_name,
                                          const std::string& key, const Chunk& chunk,
                                          std::span<const std::byte> item_prefix = {},
                                          TorchTensorRefCache* refs = nullptr);

}  // namespace fc

#endif  // FC_FORMAT_TORCH_DCP_H_
