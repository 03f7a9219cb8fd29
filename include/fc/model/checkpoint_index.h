// CheckpointIndex: what a checkpoint holds, independent of its on-disk format.
//
// Every reader (torch DCP, safetensors, fc distcp, ...) produces this; inspect, export and
// convert consume it. It is metadata only: tensor bytes stay in the files and are located by
// (file, byte_offset, byte_length, strides) per chunk.
//
//   tensor  = key, dtype, global shape, chunks
//   chunk   = a Box of the tensor (+ optional flattened range over the box's row-major
//             flattening), a replica id, and where its bytes live
//   object  = a non-tensor value (iteration counter, RNG state, ...) carried as opaque bytes
//
// Byte layout of a chunk's data, starting at `byte_offset` of `files[file]`:
//   - flat_range set:  flat_range.size() elements, packed, little-endian;
//   - strides empty:   box.num_elements() elements, row-major, packed, little-endian;
//   - strides set:     element at local index (i0..ik) is at
//                      byte_offset + (sum_j i_j * strides[j]) * DTypeSize(dtype).
//   - encoded_item set (torch DCP items written through a stream transform, e.g. zstd):
//                      the file holds the encoded item at [encoded_offset, + encoded_length);
//                      byte_offset, byte_length and strides (and an unlocated item's range)
//                      address the *decoded* item, counted from its first byte. Read such
//                      chunks through ChunkReader, such objects with ReadObjectBytes
//                      (fc/format/chunk_reader.h).
//   - unlocated_item set (torch DCP opened without reading its items): the data lies
//                      somewhere inside the container item [byte_offset, + byte_length)
//                      (a torch.save archive); byte_length is the item's size and strides
//                      are empty until located. Read such chunks through ChunkReader
//                      (fc/format/chunk_reader.h), whose Locate finds the exact place.
//
// Thread-safety: plain values.
#ifndef FC_MODEL_CHECKPOINT_INDEX_H_
#define FC_MODEL_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/flat_range.h"
#include "fc/model/key_lookup.h"
#include "fc/model/reader_retained.h"

namespace fc {

enum class CheckpointFormat {
  kTorchDcp,     // PyTorch DCP FileSystemWriter directory (.metadata + __R_N.distcp)
  kSafetensors,  // one .safetensors file, or a directory with an HF index / *.safetensors
  kFcDistcp,     // fc's native format (fc.metadata.json + R_N.distcp)
  kPaddleFlex,   // PaddlePaddle FlexCheckpoint (<id>.metadata + <rank>_<id>.distcp pickles)
  kDeepSpeed,    // DeepSpeed save/tag dir (mp_rank_XX_model_states.pt, *_optim_states.pt)
  kMegatronLegacy,  // Megatron-LM iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
};

std::string_view CheckpointFormatName(CheckpointFormat format);  // "torch-dcp", ...
Result<CheckpointFormat> ParseCheckpointFormat(std::string_view name);

struct FileInfo {
  std::string path;   // relative to CheckpointIndex::root
  uint64_t size = 0;  // bytes, as seen when the checkpoint was opened
};

// A chunk whose exact data place inside its container item is found on first read.
struct UnlocatedItem {
  DType dtype = DType::kFloat32;  // the tensor's dtype, checked against the item's
};

// An item stored encoded by a stream codec (see the layout above).
struct EncodedItem {
  enum class Codec { kZstd };  // torch DCP "stream.zstd/1"
  Codec codec = Codec::kZstd;
  uint64_t encoded_offset = 0;  // in the file
  uint64_t encoded_length = 0;
};

struct Chunk {
  Box box;
  std::optional<FlatRange> flat_range;
  int64_t replica_id = 0;
  uint32_t file = 0;           // index into CheckpointIndex::files
  uint64_t byte_offset = 0;    // absolute offset in the file of the chunk's first element
  uint64_t byte_length = 0;    // bytes of the chunk's data region (see the layout above)
  Shape strides;               // element strides; empty means packed row-major
  std::optional<uint64_t> xxh3_64;  // checksum of [byte_offset, byte_offset + byte_length)
  std::optional<UnlocatedItem> unlocated_item;  // see the layout above
  std::optional<EncodedItem> encoded_item;      // see the layout above

  // Elements actually stored: flat_range size, or box.num_elements().
  int64_t stored_elements() const {
    return flat_range ? flat_range->size() : box.num_elements();
  }
};

// The exact place of a chunk's data (what a located Chunk carries in byte_offset,
// byte_length and strides).
struct ChunkLocation {
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  Shape strides;  // empty: packed row-major
};

struct TensorEntry {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  std::vector<Chunk> chunks;
};

enum class ObjectEncoding {
  kTorchSave,  // a torch.save zip (torch DCP BYTE_IO items)
  kRaw,        // opaque bytes
};

struct ObjectEntry {
  std::string key;
  ObjectEncoding encoding = ObjectEncoding::kRaw;
  uint32_t file = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  std::optional<uint64_t> xxh3_64;
  std::optional<EncodedItem> encoded_item;  // set: byte range is in the decoded item
};

struct CheckpointIndex {
  CheckpointFormat format = CheckpointFormat::kFcDistcp;
  std::string root;  // directory holding the files (for a single file: its directory)
  std::vector<FileInfo> files;
  std::vector<TensorEntry> tensors;  // unique keys, in the order the format lists them
  std::vector<ObjectEntry> objects;
  // Format-specific facts worth showing (e.g. "torch_generation" -> "1.13" or "2").
  std::map<std::string, std::string> attributes;
  // What the reader kept of the files it parsed (fc/model/reader_retained.h), for the same
  // format's writers; null when it kept nothing. Not part of the value.
  std::shared_ptr<const ReaderRetained> retained;

  // attributes[key], or empty when the format does not state it.
  std::string Attribute(const std::string& key) const {
    auto it = attributes.find(key);
    return it == attributes.end() ? std::string() : it->second;
  }

  // The tensor named `key`, or nullptr. O(1) on average (see fc/model/key_lookup.h);
  // concurrent lookups are safe, a lookup concurrent with a change of `tensors` is not.
  const TensorEntry* FindTensor(std::string_view key) const;
  uint64_t total_file_bytes() const;

  KeyLookupCache tensor_lookup;  // FindTensor's cache; not part of the value
};

// For formats that hold two copies of a weight (DeepSpeed: the fp32 <p> and the 16-bit
// module.<p>; Megatron: the model <p> and the master optimizer.fp32.<p>): drops every tensor
// named <prefix><name>; with `substitute`, each first takes the place of the tensor <name>
// (under that name) where one exists. Other tensors keep their order.
void FoldPrefixedTensors(CheckpointIndex* index, std::string_view prefix, bool substitute);

}  // namespace fc

#endif  // FC_MODEL_CHECKPOINT_INDEX_H_
