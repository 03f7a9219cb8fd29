// safetensors: reader, streaming writer, and the HuggingFace sharded layout.
//
// File layout (huggingface/safetensors; see also shared/reference/formats.md section 6):
//
//   1. bytes [0, 8)        N, u64 little-endian: length of the JSON header in bytes.
//                          fc accepts N <= 100,000,000 (the reference reader's limit).
//   2. bytes [8, 8+N)      UTF-8 JSON object, optionally followed by spaces (0x20) that pad
//                          it. Members:
//                            "__metadata__": {"<str>": "<str>", ...}   optional; strings only
//                                                                      (null is read as absent)
//                            "<tensor name>": {"dtype": "F32",
//                                              "shape": [d0, d1, ...],      ([] = scalar)
//                                              "data_offsets": [begin, end]}
//                          Other members of a tensor entry are ignored; duplicate names, a
//                          missing or mistyped field, or an unknown dtype are errors.
//   3. bytes [8+N, EOF)    the data buffer. data_offsets are relative to its start (8+N).
//                          A tensor's bytes are little-endian, row-major, contiguous, and
//                          end - begin == prod(shape) * itemsize (zero-element: begin == end).
//                          Sorted by offset, the tensors tile the buffer exactly: the first
//                          begins at 0, each begins where the previous ends, and
//                          8 + N + last end == file size (no gaps, no overlaps, no tail).
//
// Reading never assumes alignment: other writers (MLX) do not pad the header.
//
// What fc writes (SafetensorsWriter):
//   - the JSON is compact (serde_json style: no whitespace), "__metadata__" first, then one
//     entry per tensor in file order, with data offsets in that same order. File order is
//     the reference writer's (SortLikeSafetensorsReference: descending dtype alignment, then
//     name), so that every tensor starts at a multiple of its element size; with
//     `order = kAsGiven` or `align_each_tensor` it is the order given. Tensor indices (Write,
//     layout().tensor_*) always refer to the order given;
//   - the header is padded with spaces so that 8 + N is a multiple of `alignment` (default 8,
//     which is exactly the reference writer's "N % 8 == 0");
//   - with `align_each_tensor`, every tensor additionally starts at a multiple of
//     `alignment` in the file: where a gap is needed, a zero-filled 1-D "U8" entry named
//     "@pad<k>" (k = 0, 1, ... in file order) fills it, so the file still tiles and any
//     safetensors reader accepts it. fc distcp data files use this with alignment 64.
//   With the default order the bytes are the reference writer's for the same tensors and
//   metadata (metadata keys in the order given).
//
// HuggingFace sharded layout (huggingface_hub split_torch_state_dict_into_shards):
//   model-00001-of-00003.safetensors, ... (1-based, 5 digits) plus
//   model.safetensors.index.json:
//     {"metadata": {"total_size": <sum of tensor data bytes>},
//      "weight_map": {"<tensor name>": "<file name>", ...}}
//   A model that fits one shard is a single model.safetensors with no index.
//
// Thread-safety: free functions are pure or touch only their own files. SafetensorsWriter::
// Write may be called from several threads at once (distinct or not; it serialises its
// bookkeeping); Create/Finish/Abort must not race with anything.
#ifndef FC_FORMAT_SAFETENSORS_H_
#define FC_FORMAT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/format/open_problems.h"

namespace fc {

class RandomAccessFile;
class WritableFile;

// The reference reader's cap on N.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// `__metadata__` as (key, value) pairs, in file order.
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// One header entry as stored.
struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;  // in elements of dtype (packed types: the header's last dimension / 2 or 4)
  uint64_t begin = 0;  // data_offsets[0], relative to the data buffer
  uint64_t end = 0;    // data_offsets[1]
  uint64_t byte_length() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_length = 0;  // N
  SafetensorsMetadata metadata;
  std::vector<SafetensorsTensorInfo> tensors;  // header key order

  // Absolute file offset of the data buffer: 8 + N.
  uint64_t data_start() const { return 8 + header_length; }
};

// Reads N from the first 8 bytes and checks 8 <= file_size, N <= 100,000,000 and
// 8 + N <= file_size.
// Errors: kDataLoss ("file is 5 bytes, shorter than the 8-byte length prefix", "header
// length 123456789012 exceeds the limit 100000000", "header length 900 runs past the end of
// the 100-byte file"); kInvalidArgument when `first_bytes` has fewer than 8 bytes although
// the file has them.
Result<uint64_t> ParseSafetensorsHeaderLength(std::span<const std::byte> first_bytes,
                                              uint64_t file_size);

// Parses and validates a whole header. `first_bytes` starts at file offset 0 and holds at
// least 8 + N bytes (more is fine, e.g. the whole file); `file_size` is the size of the
// whole file. Validation (all kDataLoss unless noted; each message names the tensor and the
// values involved):
//   - the length rules of ParseSafetensorsHeaderLength;
//   - the JSON is valid UTF-8 JSON and its root is an object;
//   - "__metadata__" is an object of string values (or null); keys unique;
//   - every other member is an object with "dtype" (a string naming a dtype: every
//     safetensors dtype is read, C128 excepted (kUnimplemented); the packed sub-byte floats
//     F4, F6_E2M3 and F6_E3M2 by the reference's rule (safetensors/src/tensor.rs,
//     Metadata::validate): values x bits must be whole bytes and equal end - begin; they
//     become the packed DTypes (fc/core/dtype.h), whose shape is the header's with the last
//     dimension divided by 2 (F4) or 4 (F6); a valid one whose last dimension is not such a
//     multiple (rows that are not whole bytes) makes the otherwise valid file kUnimplemented,
//     naming the first such tensor, after the tiling check),
//     "shape" (array of integers in [0, 2^63)), "data_offsets" (two integers, begin <= end);
//   - end - begin == prod(shape) * itemsize, computed with overflow checks (kDataLoss on
//     overflow as well: a shape whose byte size overflows cannot be in a real file);
//   - tensor names are unique;
//   - the tensors tile [0, file_size - 8 - N) exactly.
// kInvalidArgument when first_bytes is shorter than 8 + N.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> first_bytes,
                                                 uint64_t file_size);

// Reads and parses the header of an open file (two reads: the prefix, then the JSON).
// Errors: as ParseSafetensorsHeader, prefixed with the file's path; kIoError on read errors.
Result<SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file);

// ReadSafetensorsHeader for verification: when `tiling_problem` is not null, entries that do
// not tile the data buffer exactly (a gap, an overlap, a buffer shorter or longer than the
// entries, e.g. a truncated file) are not an error: the message goes to *tiling_problem
// (left as is when the tiling is right) and the entries are returned as written.
Result<SafetensorsHeader> ReadSafetensorsHeaderLenient(const RandomAccessFile& file,
                                                       std::string* tiling_problem);

// Opens a safetensors checkpoint:
//   - `path` is a "*.safetensors.index.json" file: that index (as below);
//   - `path` is any other file: that one safetensors file;
//   - `path` is a directory holding "*.safetensors.index.json": the index
//     ("model.safetensors.index.json" when there are several; several others are
//     kInvalidArgument: pass the index file instead). Every file named in weight_map is
//     read; every tensor must be in the file the index names (kDataLoss otherwise, also
//     for a tensor the index omits);
//     weight_map file names must be relative and free of "..";
//   - `path` is a directory without an index: every "*.safetensors" file in it, sorted by
//     name, or when there is none, every "*.safetensors" file in its "sharded/"
//     subdirectory; a tensor name present in two files is kDataLoss unless both are DCP
//     shards (below).
// DCP shards (torch HuggingFaceStorageWriter distributed saves, files
// "shard-0000S-model-0000K-of-0000N.safetensors" directly in the path or in "sharded/"):
// a file whose "__metadata__" has "DCP_SHARDING_INFO" holds pieces of tensors; each tensor
// of it is one chunk at its "saved_offsets" (kDataLoss when missing, of the wrong rank, or
// overflowing). Pieces of one name form one tensor (same dtype and rank, else kDataLoss)
// whose global shape is the furthest piece end in each dimension; identical boxes are
// replicas 1, 2, ... in file order. Coverage of the global shape is not checked here (a
// consumer checks it). "DCP_SHARDING_INFO" is not copied into the attributes;
// "dcp_sharded_files" counts such files. A directory holding consolidated model-* files
// and an index beside sharded/ is read through the index (the consolidated tensors).
// The index: format kSafetensors, root = the directory (the file's directory for a single
// file), files relative to root; each tensor one chunk (the whole tensor, packed), replica 0,
// no checksum. Tensor order: the weight_map order with an index, otherwise file order then
// header order. attributes: "safetensors.metadata.<key>" for each "__metadata__" entry (the
// first file that sets a key wins), "hf_index" (index file name) and "hf_total_size" (as
// written) when an index was read.
// Errors: kNotFound for a missing path or a file the index names; kInvalidArgument for a
// directory with no safetensors files; header errors prefixed with the file name.
// With `lenient` (fc-inspect --verify; fc/format/open_problems.h), recorded instead of
// failing: a file that cannot be opened or whose header cannot be parsed (the file and its
// tensors are left out), entries that do not tile a file's data buffer (except a buffer
// too short for them, e.g. a truncated file: its tensors are kept and VerifyCheckpoint names
// each one whose bytes pass the end), a tensor stored in two files (the first is kept),
// weight_map entries that disagree with the files.
Result<CheckpointIndex> ReadSafetensorsCheckpoint(const std::string& path,
                                                  OpenProblems* lenient = nullptr);

// ---------------------------------------------------------------------------------------
// Writing.

struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;  // in elements of dtype; the header of a packed type counts values (x 2 or 4)
};

struct SafetensorsWriteOptions {
  // Power of two >= 8. The data buffer starts at a multiple of it (header padding).
  uint64_t alignment = 8;
  // Also start every tensor at a multiple of `alignment` ("@pad<k>" entries, see above).
  bool align_each_tensor = false;
  // File order of the tensors (see above). kAsGiven with tensors of mixed sizes can leave a
  // tensor at an offset that is not a multiple of its element size (legal, but slower for
  // readers that map the file).
  enum class Order { kReference, kAsGiven };
  Order order = Order::kReference;
  // Write "<path>.fc-tmp-<pid>" and rename it to `path` in Finish(), so an unfinished or
  // aborted file never appears under its final name. Off when the caller already writes
  // into a staging directory (fc distcp).
  bool atomic = true;
};

// The bytes and offsets a writer will produce; pure function of its inputs.
struct SafetensorsLayout {
  std::string header;               // the first 8 + N bytes of the file
  std::vector<SafetensorsTensorInfo> entries;  // every header entry, in header order,
                                               // padding entries included
  std::vector<size_t> tensor_entry;     // tensor index (order given) -> index into `entries`
  std::vector<uint64_t> tensor_offset;  // tensor index -> absolute file offset of its data
  std::vector<uint64_t> tensor_bytes;   // tensor index -> byte length
  uint64_t file_size = 0;

  uint64_t data_start() const { return header.size(); }
};

// Computes the layout. Errors (kInvalidArgument): empty tensor list is fine, but a name that
// is empty, "__metadata__", not valid UTF-8, duplicated, or equal to a padding name in use;
// negative extents; metadata keys duplicated or not UTF-8; bad alignment. kOutOfRange when a
// byte size overflows or N would exceed 100,000,000.
Result<SafetensorsLayout> ComputeSafetensorsLayout(std::span<const SafetensorsTensorSpec> tensors,
                                                   const SafetensorsMetadata& metadata,
                                                   const SafetensorsWriteOptions& options);

// Reorders `tensors` the way the reference writer (safetensors.torch.save_file) lays them
// out: by dtype alignment, largest first, ties broken by upstream's Dtype enum order
// (descending: I64, F64, F32, I32, BF16, F16, I16, F8_E4M3, F8_E5M2, I8, U8, BOOL), then by
// name (byte order). Stable and deterministic. (The packed F4/F6 types come last, before
// BOOL, as upstream's enum has them; they have no alignment to keep.)
void SortLikeSafetensorsReference(std::vector<SafetensorsTensorSpec>& tensors);

// Streams one safetensors file to disk.
//
//   auto w = SafetensorsWriter::Create(path, specs, metadata);   // header written here
//   w->Write(i, offset_in_tensor, bytes);  // any order, any slab sizes, each byte once
//   w->Finish();                           // all bytes present? fsync, close, rename
//
// Write() rejects (kInvalidArgument) a tensor index out of range, a range past the tensor's
// end, and any byte written a second time. Finish() returns kFailedPrecondition naming the
// first tensor with missing bytes and the first missing range. After any failed I/O the
// writer is poisoned: further Writes and Finish return that error. The destructor calls
// Abort() unless Finish() succeeded; Abort() closes and deletes the (temporary) file.
// Identical inputs give byte-identical files.
class SafetensorsWriter {
 public:
  static Result<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
      SafetensorsMetadata metadata = {}, SafetensorsWriteOptions options = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::string& path() const { return path_; }  // the final path
  const SafetensorsLayout& layout() const { return layout_; }
  const std::vector<SafetensorsTensorSpec>& tensors() const { return tensors_; }

  // Writes `bytes` at byte `offset` of tensor `tensor`'s data.
  Status Write(size_t tensor, uint64_t offset, std::span<const std::byte> bytes);
  // Write(tensor, 0, bytes) with bytes.size() == the tensor's byte length.
  Status WriteTensor(size_t tensor, std::span<const std::byte> bytes);
  // True when every byte of `tensor` has been written.
  bool IsTensorComplete(size_t tensor) const;

  Status Finish();
  void Abort();

 private:
  SafetensorsWriter() = default;
  // [begin -> end) ranges written so far, merged.
  using RangeSet = std::map<uint64_t, uint64_t>;

  std::string path_;
  std::string write_path_;  // path_ or the temporary name
  std::vector<SafetensorsTensorSpec> tensors_;
  SafetensorsLayout layout_;
  std::unique_ptr<WritableFile> file_;
  mutable std::mutex mu_;
  std::vector<RangeSet> written_;
  std::vector<uint64_t> bytes_done_;
  Status poisoned_;
  bool finished_ = false;
};

// ---------------------------------------------------------------------------------------
// HuggingFace sharding.

struct HfShardAssignment {
  std::vector<std::string> file_names;  // "model.safetensors" or "model-0000i-of-0000N..."
  std::vector<uint32_t> tensor_file;    // input tensor index -> index into file_names
  std::vector<uint64_t> file_bytes;     // tensor data bytes per file
};

// Assigns tensors, in the given order, to shard files: a tensor goes into the current
// shard unless that would take the shard past `max_shard_bytes` (tensor data bytes; headers
// not counted), in which case a new shard starts; a tensor larger than the limit gets a
// shard of its own. (huggingface_hub appends such a tensor's shard out of order; fc keeps
// the input order across files. Within a file SafetensorsWriter lays the tensors out in the
// reference writer's order, so reading the files back gives that order per file.) One shard
// gives "model.safetensors". No tensors gives one empty "model.safetensors".
// Errors: kInvalidArgument when max_shard_bytes == 0.
Result<HfShardAssignment> AssignHfShards(
    std::span<const std::pair<std::string, uint64_t>> tensor_bytes, uint64_t max_shard_bytes);

// The text of model.safetensors.index.json for an assignment: Python json.dumps(indent=2,
// sort_keys=True) style, trailing newline, total_size = sum of tensor bytes.
// Precondition: tensor_bytes is the list given to AssignHfShards.
std::string WriteHfIndexJson(std::span<const std::pair<std::string, uint64_t>> tensor_bytes,
                             const HfShardAssignment& assignment);

inline constexpr std::string_view kHfIndexFileName = "model.safetensors.index.json";
// `__metadata__` key of torch DCP's HuggingFaceStorageWriter distributed saves and of its
// SAFETENSORS serialization: JSON {"<fqn>": {"saved_offsets": [o0, o1, ...]}, ...}.
inline constexpr std::string_view kDcpShardingInfoKey = "DCP_SHARDING_INFO";
// Subdirectory of the per-rank shards when the save also consolidates.
inline constexpr std::string_view kHfShardedDirName = "sharded";

}  // namespace fc

#endif  // FC_FORMAT_SAFETENSORS_H_
