// ReadTorchDcp: .metadata (+ optionally every item's zip directory) -> CheckpointIndex.
// Layout and contract: include/fc/format/torch_dcp.h.
//
// Each item is a torch.save zip embedded in a .distcp file. Opening checks everything the
// .metadata says (boxes, storage entries, item ranges inside their files and not
// overlapping) with hash lookups, and reads no item: with a million chunks, reading two
// windows per item was two million preads and a million data.pkl parses. Finding a tensor's
// bytes inside its item (LocateTorchDcpChunk, at open with locate_chunks or on first read
// through ChunkReader) needs the zip's tail (EOCD + central directory), data.pkl near its
// start, and the storage record's local header. ItemReader serves those small reads from
// two cached windows (or the whole item when it is small): one or two preads per item. A
// window is 4 KiB, or less when the item's headers are known to be smaller (an item of a
// tensor of T bytes has at most length - T bytes outside the data: a head window of that
// size holds data.pkl and the storage record's header, a tail window the zip directory), so
// that locating an item does not read its data too, only to read it again (issue 31).
#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/format/file_names.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/safetensors.h"
#include "fc/format/torch_dcp_transform.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"
#include "src/format/megatron/megatron_buckets.h"
#include "src/format/megatron/torch_dist.h"

namespace fc {
namespace {

constexpr uint64_t kMaxMetadataBytes = uint64_t{4} << 30;
constexpr uint64_t kWindowBytes = 4096;

std::string Range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

using json_internal::ShapeText;

// Reads inside one item ([base, base + length) of a file) with archive-relative offsets.
class ItemReader {
 public:
  // `window`: the size of a cached window (at most kWindowBytes); an item of at most two
  // windows is read whole, in one pread, on the first access.
  ItemReader(const RandomAccessFile* file, uint64_t base, uint64_t length,
             uint64_t window = kWindowBytes)
      : file_(file), base_(base), length_(length),
        window_(std::clamp<uint64_t>(window, kMinWindowBytes, kWindowBytes)),
        whole_item_bytes_(2 * window_) {}

  // The window for an item of `length` bytes that holds `data_bytes` of tensor data: its
  // headers (data.pkl, local headers, zip directory) are the rest.
  static uint64_t WindowFor(uint64_t length, uint64_t data_bytes) {
    return data_bytes < length ? length - data_bytes : kWindowBytes;
  }

  // The item's first bytes, read by the caller (the file's bytes [base, + prefix.size()),
  // at most the item's length): reads inside them are served from there. Must outlive the
  // reader.
  void SetPrefix(std::span<const std::byte> prefix) {
    prefix_ = prefix.first(static_cast<size_t>(std::min<uint64_t>(prefix.size(), length_)));
  }

  Status Read(uint64_t offset, std::span<std::byte> dst) {
    if (offset > length_ || dst.size() > length_ - offset) {
      return DataLossError("read of item bytes " + Range(offset, offset + dst.size()) +
                           " passes the item's end at " + std::to_string(length_));
    }
    if (dst.empty()) return Status::Ok();
    if (offset + dst.size() <= prefix_.size()) {
      std::memcpy(dst.data(), prefix_.data() + offset, dst.size());
      return Status::Ok();
    }
    for (Window& w : windows_) {
      if (w.valid && offset >= w.start && offset + dst.size() <= w.start + w.bytes.size()) {
        std::memcpy(dst.data(), w.bytes.data() + (offset - w.start), dst.size());
        return Status::Ok();
      }
    }
    if (dst.size() > window_ && length_ > whole_item_bytes_) {
      return file_->ReadAt(base_ + offset, dst);
    }
    // Load a window starting at the request (or ending at the item's end, whichever keeps
    // it inside the item); it then also serves the neighbouring small reads.
    Window& w = windows_[next_];
    next_ = 1 - next_;
    const uint64_t span = length_ <= whole_item_bytes_ ? length_ : std::min(length_, window_);
    w.start = std::min(offset, length_ - span);
    w.bytes.resize(static_cast<size_t>(span));
    w.valid = false;
    FC_RETURN_IF_ERROR(file_->ReadAt(base_ + w.start, w.bytes));
    w.valid = true;
    std::memcpy(dst.data(), w.bytes.data() + (offset - w.start), dst.size());
    return Status::Ok();
  }

  ZipReadFn AsZipReadFn() {
    return [this](uint64_t offset, std::span<std::byte> dst) { return Read(offset, dst); };
  }

 private:
  struct Window {
    bool valid = false;
    uint64_t start = 0;
    std::vector<std::byte> bytes;
  };
  // Below this a window would cost more read calls than the bytes it saves.
  static constexpr uint64_t kMinWindowBytes = 512;
  const RandomAccessFile* file_;
  uint64_t base_;
  uint64_t length_;
  uint64_t window_;
  uint64_t whole_item_bytes_;
  Window windows_[2];
  int next_ = 0;
  std::span<const std::byte> prefix_;
};

// SerializationFormat.SAFETENSORS (~2.8+): after the byte items, one safetensors blob that
// runs to the end of the file; every tensor's _StorageInfo has offset = the blob's start and
// length = its byte size, so the metadata's ranges overlap and do not locate anything.
// A torch.save item starts with a zip local header ("PK\3\4"); a blob with its u64 header
// length and then '{'.
bool IsSafetensorsBlobHead(std::span<const std::byte, 9> head) {
  if (head[0] == std::byte{'P'} && head[1] == std::byte{'K'} && head[2] == std::byte{3} &&
      head[3] == std::byte{4}) {
    return false;
  }
  return head[8] == std::byte{'{'};
}

Result<bool> IsSafetensorsBlob(const RandomAccessFile& file, uint64_t offset) {
  if (offset > file.size() || file.size() - offset < 9) return false;
  std::byte head[9];
  FC_RETURN_IF_ERROR(file.ReadAt(offset, head));
  return IsSafetensorsBlobHead(head);
}

// A chunk's offsets and sizes as the DCP metadata gives them. They are the chunk's box, except
// for a chunk of a tensor Megatron saved N-D reformulated (UndoMegatronReformulation): there
// the metadata has (fragment index..., range start) and (1, ..., 1, range length).
Shape DcpChunkOffsets(const Chunk& chunk) {
  if (!chunk.flat_range) return chunk.box.global_offset;
  Shape offsets;
  for (size_t i = 0; i < chunk.box.rank(); ++i) {
    offsets.push_back(chunk.box.local_shape[i] == 0
                          ? 0
                          : chunk.box.global_offset[i] / chunk.box.local_shape[i]);
  }
  offsets.push_back(chunk.flat_range->inclusive_min);
  return offsets;
}

Shape DcpChunkSizes(const Chunk& chunk) {
  if (!chunk.flat_range) return chunk.box.local_shape;
  Shape sizes(chunk.box.rank(), 1);
  sizes.push_back(chunk.flat_range->size());
  return sizes;
}

// The place of `key`'s chunk in the blob at `offset`: found through the blob's own header,
// checked against its DCP_SHARDING_INFO and the chunk (dtype, sizes, byte size).
Result<ChunkLocation> LocateInSafetensorsBlob(const RandomAccessFile& file, uint64_t offset,
                                              const std::string& key, const Chunk& chunk,
                                              DType dtype) {
  const uint64_t blob_size = file.size() - offset;
  std::byte prefix[8];
  FC_RETURN_IF_ERROR(file.ReadAt(offset, prefix));
  FC_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsHeaderLength(prefix, blob_size));
  std::vector<std::byte> head(static_cast<size_t>(8 + n));
  FC_RETURN_IF_ERROR(file.ReadAt(offset, head));
  FC_ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensorsHeader(head, blob_size));
  const std::string where = "safetensors blob at byte " + std::to_string(offset);
  const SafetensorsTensorInfo* info = nullptr;
  for (const SafetensorsTensorInfo& t : h.tensors) {
    if (t.name == key) info = &t;
  }
  if (info == nullptr) return DataLossError(where + " has no entry '" + key + "'");
  const std::string* sharding = nullptr;
  for (const auto& [k, v] : h.metadata) {
    if (k == kDcpShardingInfoKey) sharding = &v;
  }
  if (sharding == nullptr) {
    return DataLossError(where + " has no " + std::string(kDcpShardingInfoKey) + " metadata");
  }
  simdjson::dom::parser parser;
  FC_ASSIGN_OR_RETURN(
      simdjson::dom::element root,
      json_internal::ParseDocument(
          parser, std::as_bytes(std::span<const char>(sharding->data(), sharding->size())),
          where + " " + std::string(kDcpShardingInfoKey)));
  simdjson::dom::element offsets;
  std::optional<Shape> saved;
  if (root[key]["saved_offsets"].get(offsets) != simdjson::SUCCESS ||
      !(saved = json_internal::GetShape(offsets))) {
    return DataLossError(where + " " + std::string(kDcpShardingInfoKey) + " has no " +
                         "\"saved_offsets\" array for '" + key + "'");
  }
  if (*saved != DcpChunkOffsets(chunk)) {
    return DataLossError(where + ": saved_offsets " + ShapeText(*saved) +
                         " != the chunk's offsets " + ShapeText(DcpChunkOffsets(chunk)));
  }
  if (info->dtype != dtype) {
    return DataLossError(where + ": entry dtype " + std::string(DTypeName(info->dtype)) +
                         " != metadata dtype " + std::string(DTypeName(dtype)));
  }
  if (info->shape != DcpChunkSizes(chunk)) {
    return DataLossError(where + ": entry shape " + ShapeText(info->shape) +
                         " != chunk sizes " + ShapeText(DcpChunkSizes(chunk)));
  }
  if (info->byte_length() != chunk.byte_length) {
    return DataLossError(where + ": entry holds " + std::to_string(info->byte_length()) +
                         " bytes, the metadata's length is " + std::to_string(chunk.byte_length));
  }
  return ChunkLocation{offset + h.data_start() + info->begin, info->byte_length(), {}};
}

// Sort key for data files: __<rank>_<n>.distcp by (rank, n), others after, by name.
struct FileOrder {
  bool parsed = false;
  uint64_t rank = 0, n = 0;
  std::string name;
  friend bool operator<(const FileOrder& a, const FileOrder& b) {
    if (a.parsed != b.parsed) return a.parsed;
    if (a.parsed && (a.rank != b.rank || a.n != b.n)) {
      return a.rank != b.rank ? a.rank < b.rank : a.n < b.n;
    }
    return a.name < b.name;
  }
};

FileOrder OrderOf(const std::string& name) {
  FileOrder o;
  o.name = name;
  if (std::optional<NumberedName> m = MatchNumberedName(name, "__#_#.distcp")) {
    o.parsed = true;
    o.rank = (*m)[0];
    o.n = (*m)[1];
  }
  return o;
}

// A relative_path must name a file inside the checkpoint directory.
Status CheckRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) {
    return DataLossError("relative_path '" + path + "' is not a relative file name");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (path.compare(start, slash - start, "..") == 0 && slash - start == 2) {
      return DataLossError("relative_path '" + path + "' escapes the checkpoint directory");
    }
    start = slash + 1;
  }
  return Status::Ok();
}

// Hash of an offsets list, for the storage_data lookup.
struct OffsetsHash {
  size_t operator()(std::span<const int64_t> v) const {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ v.size();
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};
struct OffsetsEq {
  bool operator()(std::span<const int64_t> a, std::span<const int64_t> b) const {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
};

// storage_data entries of one fqn: the bytes item (no offsets) and the chunks by offsets.
// Keys view the Shapes inside DcpMetadata::storage, which outlives the lookups.
struct ChunkStorage {
  const DcpStorageInfo* info = nullptr;
  // The last item (Merge's serial number) whose chunk list named these offsets: a second
  // chunk of that item at the same offsets is a duplicate. (No set per item: millions.)
  mutable size_t claimed_by = SIZE_MAX;
};
struct FqnStorage {
  const DcpStorageInfo* object = nullptr;
  std::unordered_map<std::span<const int64_t>, ChunkStorage, OffsetsHash, OffsetsEq> chunks;
};

// One item byte range, for the overlap check; the label is built only for an error.
struct ItemRange {
  uint64_t inclusive_min, exclusive_max;
  const DcpItemMetadata* item;
  const Box* chunk;  // the index chunk's box; nullptr for objects
};

std::string ChunkBoxText(const Shape& offsets, const Shape& sizes) {
  // Box::ToString needs equal ranks; fall back to the raw lists otherwise.
  if (offsets.size() == sizes.size()) return Box{offsets, sizes}.ToString();
  return "offsets " + ShapeText(offsets) + " sizes " + ShapeText(sizes);
}
std::string ChunkBoxText(const DcpChunkMetadata& cm) { return ChunkBoxText(cm.offsets, cm.sizes); }

std::string ItemLabel(const ItemRange& r) {
  if (!r.item->is_tensor) return "object '" + r.item->fqn + "'";
  return "tensor '" + r.item->fqn + "' chunk " +
         ChunkBoxText(r.chunk->global_offset, r.chunk->local_shape);
}

// One metadata file: the global `.metadata`, or one rank's `__R.metadata` of a save without
// rank coordination.
struct Source {
  std::string name;  // file name inside the checkpoint directory
  DcpMetadata md;
  std::unordered_map<std::string_view, FqnStorage> storage;  // views md's strings
};

// An item of the union of all sources. Chunks keep the order of the sources (rank order),
// then of their chunk lists; a chunk whose box another source already stores is a replica.
struct MergedChunk {
  const DcpChunkMetadata* meta;
  const DcpStorageInfo* storage;
  const Source* source;
  int64_t replica_id = 0;
};
struct MergedItem {
  const DcpItemMetadata* item;  // as the first source that lists it says
  const Source* source;
  std::vector<MergedChunk> chunks;       // tensors
  const DcpStorageInfo* object = nullptr;  // bytes items: the first source's entry
  const Source* object_source = nullptr;
  // Chunk offsets -> (index in `chunks` of the first chunk there, replicas after it).
  std::unordered_map<std::span<const int64_t>, std::pair<size_t, int64_t>, OffsetsHash,
                     OffsetsEq>
      by_offsets;
};

std::string DTypeAndShape(const DcpItemMetadata& item) {
  return std::string(DTypeName(item.dtype)) + " " + ShapeText(item.size);
}

class DcpReader {
 public:
  DcpReader(std::string dir, TorchDcpReadOptions options)
      : dir_(std::move(dir)), options_(options) {}
  Result<CheckpointIndex> Read();

 private:
  Result<uint32_t> FileIndex(const std::string& relative_path) {
    auto it = file_index_.find(relative_path);
    if (it == file_index_.end()) {
      return InternalError("file '" + relative_path + "' was not registered");
    }
    return it->second;
  }
  // Checks that the item lies inside its file; returns the file.
  Result<const RandomAccessFile*> ItemFile(const DcpStorageInfo& s, uint32_t file) {
    const RandomAccessFile* f = files_[file].get();
    auto end = CheckedAddU(s.offset, s.length);
    if (!end || *end > f->size()) {
      return DataLossError("item bytes " + Range(s.offset, s.offset + s.length) +
                           " pass end of file (" + std::to_string(f->size()) + " bytes)");
    }
    return f;
  }
  Status LoadSources();
  Status IndexStorage(Source& src);
  Status Merge();
  Status ReadTensor(const MergedItem& m, TensorEntry* out);
  Status ReadObject(const MergedItem& m, ObjectEntry* out);
  Status CheckOverlaps();
  void AddAttributes(CheckpointIndex* index);

  std::string dir_;
  TorchDcpReadOptions options_;
  std::vector<std::unique_ptr<Source>> sources_;  // rank order for rank-local files
  std::vector<MergedItem> merged_;                // first-appearance order
  std::unordered_map<std::string, uint32_t> file_index_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<std::vector<ItemRange>> ranges_;  // per file
  std::set<uint32_t> blob_files_;  // files whose tensor items are a safetensors blob
  std::unordered_set<std::string> missing_;     // lenient: data files that cannot be opened
};

Status DcpReader::ReadTensor(const MergedItem& m, TensorEntry* out) {
  const DcpItemMetadata& item = *m.item;
  out->key = item.fqn;
  out->dtype = item.dtype;
  out->global_shape = item.size;
  out->chunks.reserve(m.chunks.size());
  for (const MergedChunk& mc : m.chunks) {
    // The box is moved out of the metadata (Merge, the only other reader of the chunk
    // lists, is done): two allocations and copies fewer per chunk.
    DcpChunkMetadata& cm = const_cast<DcpChunkMetadata&>(*mc.meta);
    Chunk chunk;
    chunk.box.global_offset = std::move(cm.offsets);
    chunk.box.local_shape = std::move(cm.sizes);
    auto label = [&] {
      return "tensor '" + item.fqn + "' chunk " +
             ChunkBoxText(chunk.box.global_offset, chunk.box.local_shape);
    };
    chunk.replica_id = mc.replica_id;
    if (Status v = ValidateBox(chunk.box, item.size); !v.ok()) {
      return v.With(mc.source->name + ": " + label());
    }
    const DcpStorageInfo& s = *mc.storage;
    if (missing_.count(s.relative_path)) continue;  // recorded (lenient)
    FC_ASSIGN_OR_RETURN(chunk.file, FileIndex(s.relative_path));
    // Leniently, an item past the end of its file is kept: VerifyCheckpoint fails to locate
    // it and says so, with the file, the tensor and the bytes.
    if (auto f = ItemFile(s, chunk.file); !f.ok() && !options_.lenient) {
      return f.status().With(s.relative_path + ": " + label());
    }
    // The item's range for now; the data's exact place is found by LocateTorchDcpChunk
    // (at the end of Read with options_.locate_chunks, else on first read). An encoded
    // item's range is in its decoded bytes, whose size is unknown until decoded: [0, 0).
    if (!s.transform_descriptors.empty()) {
      FC_ASSIGN_OR_RETURN(EncodedItem::Codec codec,
                          CodecForTransformDescriptors(s.transform_descriptors)
                              .With(s.relative_path + ": " + label()));
      chunk.encoded_item = EncodedItem{codec, s.offset, s.length};
    } else {
      chunk.byte_offset = s.offset;
      chunk.byte_length = s.length;
    }
    chunk.unlocated_item = UnlocatedItem{item.dtype};
    out->chunks.push_back(std::move(chunk));
    // `chunks` was reserved and moves with its buffer: the box stays where it is.
    ranges_[out->chunks.back().file].push_back(
        {s.offset, s.offset + s.length, &item, &out->chunks.back().box});
  }
  return Status::Ok();
}

Status DcpReader::ReadObject(const MergedItem& m, ObjectEntry* out) {
  const DcpItemMetadata& item = *m.item;
  out->key = item.fqn;
  out->encoding = ObjectEncoding::kTorchSave;
  const std::string label = "object '" + item.fqn + "'";
  if (m.object == nullptr) {
    return DataLossError(m.source->name + ": " + label + ": no storage_data entry");
  }
  const DcpStorageInfo& s = *m.object;
  FC_ASSIGN_OR_RETURN(out->file, FileIndex(s.relative_path));
  const std::string ctx = s.relative_path + ": " + label;
  Result<const RandomAccessFile*> in_file = ItemFile(s, out->file);
  if (!in_file.ok() && options_.lenient) {
    // Kept with its range: VerifyCheckpoint reports a range past the end of its file.
    ranges_[out->file].push_back({s.offset, s.offset + s.length, &item, nullptr});
    out->byte_offset = s.offset;
    out->byte_length = s.length;
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, std::move(in_file).With(ctx));
  ranges_[out->file].push_back({s.offset, s.offset + s.length, &item, nullptr});
  if (!s.transform_descriptors.empty()) {
    // Decoded once at open: its size is the object's, and its archive is checked.
    FC_ASSIGN_OR_RETURN(EncodedItem::Codec codec,
                        CodecForTransformDescriptors(s.transform_descriptors).With(ctx));
    out->encoded_item = EncodedItem{codec, s.offset, s.length};
    FC_ASSIGN_OR_RETURN(
        DecodedItemWindows w,
        DecodeItemWindows(*f, *out->encoded_item, kMaxDecodedObjectBytes).With(label));
    auto archive = ReadTorchSaveArchive(
        w.size, [&w](uint64_t o, std::span<std::byte> dst) { return w.Read(o, dst); });
    if (!archive.ok()) {
      return archive.status().With(ctx + ": decoded item of " + std::to_string(w.size) +
                                   " bytes");
    }
    out->byte_offset = 0;
    out->byte_length = w.size;
    return Status::Ok();
  }
  // Check the archive's structure now, so a corrupt object fails at open, not at export
  // (by whoever can read it, when it lies on another process's disk).
  ItemReader reader(f, s.offset, s.length);
  auto archive = f->readable_here() ? ReadTorchSaveArchive(s.length, reader.AsZipReadFn())
                                    : Result<TorchSaveArchive>(TorchSaveArchive{});
  out->byte_offset = s.offset;
  out->byte_length = s.length;
  if (!archive.ok()) {
    const std::string what = "item bytes " + Range(s.offset, s.offset + s.length);
    if (!options_.lenient || archive.status().code() != StatusCode::kDataLoss) {
      return archive.status().With(ctx + ": " + what);
    }
    options_.lenient->Add(s.relative_path, item.fqn, what + ": " + archive.status().message());
  }
  return Status::Ok();
}

Status DcpReader::CheckOverlaps() {
  for (size_t f = 0; f < ranges_.size(); ++f) {
    auto& r = ranges_[f];
    std::sort(r.begin(), r.end(), [](const ItemRange& a, const ItemRange& b) {
      return a.inclusive_min < b.inclusive_min;
    });
    // Tensor items sharing a start are the SAFETENSORS serialization's blob (one probe read
    // tells): one range from the blob's start to the file's end, one entry per fqn.
    std::vector<ItemRange> merged;
    merged.reserve(r.size());
    for (size_t i = 0; i < r.size();) {
      size_t j = i + 1;
      while (j < r.size() && r[j].inclusive_min == r[i].inclusive_min) ++j;
      bool blob = false;
      if (j - i > 1) {
        Result<bool> probed = IsSafetensorsBlob(*files_[f], r[i].inclusive_min);
        if (!probed.ok() && options_.lenient && probed.status().code() == StatusCode::kDataLoss) {
          options_.lenient->Add(Basename(files_[f]->path()), "",
                                ItemLabel(r[i]) + ": " + probed.status().message());
          probed = false;
        }
        FC_ASSIGN_OR_RETURN(blob, std::move(probed).With(Basename(files_[f]->path())));
      }
      if (!blob) {
        merged.insert(merged.end(), r.begin() + static_cast<ptrdiff_t>(i),
                      r.begin() + static_cast<ptrdiff_t>(j));
        i = j;
        continue;
      }
      std::unordered_set<std::string_view> fqns;
      for (size_t k = i; k < j; ++k) {
        if (r[k].chunk == nullptr || !fqns.insert(r[k].item->fqn).second) {
          return DataLossError(Basename(files_[f]->path()) + ": " + ItemLabel(r[k]) +
                               " shares the safetensors blob at byte " +
                               std::to_string(r[i].inclusive_min) +
                               (r[k].chunk == nullptr ? " although it is an object"
                                                      : " with another chunk of its tensor"));
        }
      }
      blob_files_.insert(static_cast<uint32_t>(f));
      ItemRange whole = r[i];
      whole.exclusive_max = files_[f]->size();
      merged.push_back(whole);
      i = j;
    }
    r = std::move(merged);
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i].inclusive_min < r[i - 1].exclusive_max) {
        const std::string what = "items " + ItemLabel(r[i - 1]) + " " +
                                 Range(r[i - 1].inclusive_min, r[i - 1].exclusive_max) +
                                 " and " + ItemLabel(r[i]) + " " +
                                 Range(r[i].inclusive_min, r[i].exclusive_max) + " overlap";
        if (!options_.lenient) return DataLossError(Basename(files_[f]->path()) + ": " + what);
        options_.lenient->Add(Basename(files_[f]->path()), r[i].item->fqn, what);
      }
    }
  }
  return Status::Ok();
}

void DcpReader::AddAttributes(CheckpointIndex* index) {
  const DcpMetadata& md = sources_.front()->md;
  auto& a = index->attributes;
  a["torch_generation"] = md.generation;
  if (sources_.size() > 1 || sources_.front()->name != ".metadata") {
    std::string names;
    for (const auto& s : sources_) names += (names.empty() ? "" : ", ") + s->name;
    a["rank_local_metadata"] = names;
  }
  if (md.version) a["dcp_version"] = *md.version;
  if (md.checkpoint_id) a["checkpoint_id"] = *md.checkpoint_id;
  if (md.save_id) a["save_id"] = *md.save_id;
  if (md.mcore_data) megatron_internal::AddMcoreDataAttributes(*md.mcore_data, index);
  if (!md.extra_fields.empty()) {
    std::string s;
    for (const auto& f : md.extra_fields) s += (s.empty() ? "" : ", ") + f;
    a["metadata_extra_fields"] = s;
  }
  if (PathExists(JoinPath(dir_, "metadata.json"))) a["megatron_metadata_json"] = "present";
  if (PathExists(JoinPath(dir_, "common.pt"))) megatron_internal::AddMegatronCommon(dir_, a);
}

// The global .metadata, or else every rank's __R.metadata (in rank order).
Status DcpReader::LoadSources() {
  std::vector<std::pair<uint64_t, std::string>> names;
  if (PathExists(JoinPath(dir_, ".metadata"))) {
    names.emplace_back(0, ".metadata");
  } else {
    auto listed = ListDirectory(dir_);
    if (listed.ok()) {
      for (const std::string& n : *listed) {
        if (auto rank = TorchDcpRankMetadataRank(n)) names.emplace_back(*rank, n);
      }
    }
    if (names.empty()) {
      return NotFoundError(JoinPath(dir_, ".metadata") +
                           ": not found, nor any per-rank __<rank>.metadata (not a torch DCP "
                           "checkpoint?)");
    }
    std::sort(names.begin(), names.end());
  }
  for (const auto& [rank, name] : names) {
    FC_ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(JoinPath(dir_, name), kMaxMetadataBytes));
    auto src = std::make_unique<Source>();
    src->name = name;
    FC_ASSIGN_OR_RETURN(src->md, ParseDcpMetadata(bytes).With(JoinPath(dir_, name)));
    FC_RETURN_IF_ERROR(IndexStorage(*src));
    sources_.push_back(std::move(src));
  }
  return Status::Ok();
}

// storage_data of one source by fqn (bytes item, chunks by offsets).
Status DcpReader::IndexStorage(Source& src) {
  src.storage.reserve(src.md.items.size() + 1);
  for (const DcpStorageInfo& s : src.md.storage) {
    FC_RETURN_IF_ERROR_WITH(CheckRelativePath(s.relative_path),
                            src.name + ": storage_data['" + s.fqn + "']");
    FqnStorage& fs = src.storage[s.fqn];
    const bool fresh = s.chunk_offsets ? fs.chunks.emplace(*s.chunk_offsets, ChunkStorage{&s}).second
                                       : (fs.object == nullptr ? (fs.object = &s, true) : false);
    if (!fresh) {
      return DataLossError(src.name + ": storage_data has two entries for '" + s.fqn + "'" +
                           (s.chunk_offsets ? " at offsets " + ShapeText(*s.chunk_offsets)
                                            : std::string()));
    }
  }
  return Status::Ok();
}

// The union of the sources' items. A save without rank coordination lists in each rank's
// file what that rank wrote: a sharded tensor's chunks spread over the files, and values no
// coordinator deduplicated (plain tensors, non-tensor values) in several. So: the same
// fqn must have the same kind, dtype and global size everywhere; a chunk box stored by an
// earlier file again is a replica (replica_id = how many files stored it before); the same
// offsets with other sizes is a conflict; a bytes item is read from the first file listing
// it. Partial overlaps between chunks are left to the cover checks of the consumers.
Status DcpReader::Merge() {
  std::unordered_map<std::string_view, size_t> by_fqn;
  size_t item_serial = 0;
  for (const auto& src_ptr : sources_) {
    const Source& src = *src_ptr;
    for (const DcpItemMetadata& item : src.md.items) {
      auto fs_it = src.storage.find(item.fqn);
      const FqnStorage* fs = fs_it == src.storage.end() ? nullptr : &fs_it->second;
      auto [it, fresh] = by_fqn.emplace(item.fqn, merged_.size());
      if (fresh) merged_.push_back(MergedItem{&item, &src, {}, nullptr, nullptr, {}});
      MergedItem& m = merged_[it->second];
      const std::string what = (item.is_tensor ? "tensor '" : "object '") + item.fqn + "'";
      if (!fresh) {
        if (m.item->is_tensor != item.is_tensor) {
          return DataLossError(what + ": " + m.source->name + " lists it as " +
                               (m.item->is_tensor ? "a tensor" : "a bytes item") + ", " +
                               src.name + " as " + (item.is_tensor ? "a tensor" : "a bytes item"));
        }
        if (item.is_tensor && (m.item->dtype != item.dtype || m.item->size != item.size)) {
          return DataLossError(what + ": " + m.source->name + " says " +
                               DTypeAndShape(*m.item) + ", " + src.name + " says " +
                               DTypeAndShape(item));
        }
      }
      if (!item.is_tensor) {
        if (m.object == nullptr && fs != nullptr && fs->object != nullptr) {
          m.object = fs->object;
          m.object_source = &src;
        }
        continue;
      }
      const size_t serial = item_serial++;
      for (const DcpChunkMetadata& cm : item.chunks) {
        auto label = [&] { return what + " chunk " + ChunkBoxText(cm); };
        // A chunk without a storage entry fails below at its first appearance, so a repeat
        // of its offsets is only possible for offsets that have one.
        const DcpStorageInfo* s = nullptr;
        if (fs != nullptr) {
          auto c = fs->chunks.find(cm.offsets);
          if (c != fs->chunks.end()) {
            if (c->second.claimed_by == serial) {
              return DataLossError(src.name + ": " + label() + ": two chunks start at offsets " +
                                   ShapeText(cm.offsets));
            }
            c->second.claimed_by = serial;
            s = c->second.info;
          }
        }
        if (s == nullptr) {
          return DataLossError(src.name + ": " + label() +
                               ": no storage_data entry for this chunk");
        }
        // First chunk stored at these offsets (by any source) and how many stored them.
        // One source cannot hold replicas (`seen` above): no map then.
        int64_t replica = 0;
        if (sources_.size() > 1) {
          auto [at, first] = m.by_offsets.try_emplace(cm.offsets, m.chunks.size(), 0);
          if (first) {
            m.chunks.push_back(MergedChunk{&cm, s, &src, 0});
            continue;
          }
          const MergedChunk& other = m.chunks[at->second.first];
          if (other.meta->sizes != cm.sizes) {
            return DataLossError(what + " chunk at offsets " + ShapeText(cm.offsets) + ": " +
                                 other.source->name + " stores sizes " +
                                 ShapeText(other.meta->sizes) + ", " + src.name +
                                 " stores sizes " + ShapeText(cm.sizes));
          }
          replica = ++at->second.second;
        }
        m.chunks.push_back(MergedChunk{&cm, s, &src, replica});
      }
    }
  }
  for (const MergedItem& m : merged_) {
    if (!m.item->is_tensor && m.object == nullptr) {
      return DataLossError(m.source->name + ": object '" + m.item->fqn +
                           "': no storage_data entry");
    }
  }
  return Status::Ok();
}

Result<CheckpointIndex> DcpReader::Read() {
  if (!IsDirectory(dir_)) return NotFoundError(dir_ + ": not a directory");
  FC_RETURN_IF_ERROR(LoadSources());
  FC_RETURN_IF_ERROR(Merge());

  // Register every file an item uses (stale storage entries are ignored), in (rank, n) order.
  // file -> label of first item using it (a hash lookup per chunk; the keys view the
  // metadata's strings, which outlive this function's use of them)
  std::unordered_map<std::string_view, std::string> first_user;
  auto note_user = [&first_user](const std::string& path, const char* kind,
                                 const std::string& fqn) {
    if (first_user.find(path) == first_user.end()) {
      first_user.emplace(path, std::string(kind) + " '" + fqn + "'");
    }
  };
  for (const MergedItem& m : merged_) {
    for (const MergedChunk& c : m.chunks) note_user(c.storage->relative_path, "tensor", m.item->fqn);
    if (m.object != nullptr) note_user(m.object->relative_path, "object", m.item->fqn);
  }
  std::map<FileOrder, std::string> names;
  for (const auto& [path, user] : first_user) names.emplace(OrderOf(std::string(path)), path);

  CheckpointIndex index;
  index.format = CheckpointFormat::kTorchDcp;
  index.root = dir_;
  for (const auto& [order, path] : names) {
    auto f = RandomAccessFile::Open(JoinPath(dir_, path));
    if (!f.ok() && options_.lenient && f.status().code() == StatusCode::kNotFound) {
      // Recorded; its items are left out (VerifyCheckpoint then finds the elements missing).
      std::string what = f.status().message();
      const std::string full = JoinPath(dir_, path) + ": ";
      if (what.compare(0, full.size(), full) == 0) what.erase(0, full.size());
      options_.lenient->Add(path, "", what + " (data of " + first_user[path] +
                                          "; its items are left out)");
      missing_.insert(path);
      continue;
    }
    if (!f.ok()) {
      return f.status().With(path + " (data of " + first_user[path] + ")");
    }
    file_index_[path] = static_cast<uint32_t>(files_.size());
    index.files.push_back(FileInfo{path, (*f)->size()});
    files_.push_back(std::move(f).value());
  }
  ranges_.resize(files_.size());

  for (const MergedItem& m : merged_) {
    if (m.item->is_tensor) {
      TensorEntry t;
      FC_RETURN_IF_ERROR(ReadTensor(m, &t));
      index.tensors.push_back(std::move(t));
    } else {
      if (m.object != nullptr && missing_.count(m.object->relative_path)) continue;  // lenient
      ObjectEntry o;
      FC_RETURN_IF_ERROR(ReadObject(m, &o));
      index.objects.push_back(std::move(o));
    }
  }
  if (const PickleValue* mcore = sources_.front()->md.mcore_data.get();
      mcore != nullptr && mcore->is_dict()) {
    FC_ASSIGN_OR_RETURN(const int64_t restored,
                        megatron_internal::UndoMegatronReformulation(*mcore, index.tensors));
    if (restored > 0) {
      index.attributes["megatron.reformulated"] =
          std::to_string(restored) + " tensor(s) restored to their original shapes "
          "(Megatron's N-D flattened reformulation)";
    }
  }
  FC_RETURN_IF_ERROR(CheckOverlaps());
  if (options_.locate_chunks) {
    for (TensorEntry& t : index.tensors) {
      for (Chunk& c : t.chunks) {
        if (!c.unlocated_item) continue;
        FC_ASSIGN_OR_RETURN(ChunkLocation loc,
                            LocateTorchDcpChunk(*files_[c.file], index.files[c.file].path,
                                                t.key, c));
        c.byte_offset = loc.byte_offset;
        c.byte_length = loc.byte_length;
        c.strides = std::move(loc.strides);
        c.unlocated_item.reset();
      }
    }
  }
  AddAttributes(&index);
  // Megatron's distributed optimizer in the dp_reshardable form: per-param states found from
  // the data (megatron_buckets.h); left as flat buckets, with the reason, when they do not map.
  auto in_blob = [this](const Chunk& c) { return blob_files_.count(c.file) > 0; };
  if (MegatronBucketsOutcome buckets = MapMegatronOptimizerBuckets(index, in_blob); buckets.found) {
    index.attributes["megatron.optimizer_buckets"] = buckets.note;
  }
  return index;
}

}  // namespace

std::optional<uint64_t> TorchDcpRankMetadataRank(std::string_view name) {
  std::optional<NumberedName> m = MatchNumberedName(name, "__#.metadata");
  if (!m) return std::nullopt;
  return (*m)[0];
}

Result<CheckpointIndex> ReadTorchDcp(const std::string& dir, const TorchDcpReadOptions& options) {
  DcpReader reader(dir, options);
  return reader.Read();
}

Result<ChunkLocation> LocateTorchDcpChunk(const RandomAccessFile& file,
                                          const std::string& file_name,
                                          const std::string& key, const Chunk& chunk,
                                          std::span<const std::byte> item_prefix,
                                          TorchTensorRefCache* refs) {
  const std::string ctx = file_name + ": tensor '" + key + "' chunk " + chunk.box.ToString();
  if (!chunk.unlocated_item) {
    return InternalError(ctx + ": the chunk is already located");
  }
  const DType dtype = chunk.unlocated_item->dtype;
  uint64_t offset = chunk.byte_offset, length = chunk.byte_length;
  Result<TorchSaveTensor> parsed = InternalError("not parsed");
  if (chunk.encoded_item) {
    // One decoding pass: the archive's head (data.pkl, the storage record's header) and its
    // tail (the zip directory). Places are in the decoded item.
    const EncodedItem& e = *chunk.encoded_item;
    const uint64_t tensor_bytes =
        CheckedMulU(static_cast<uint64_t>(chunk.stored_elements()), DTypeSize(dtype))
            .value_or(UINT64_MAX);
    FC_ASSIGN_OR_RETURN(
        DecodedItemWindows w,
        DecodeItemWindows(file, e, MaxDecodedTensorItemBytes(tensor_bytes))
            .With(ctx + " (" + std::to_string(tensor_bytes) + " tensor bytes)"));
    offset = 0;
    length = w.size;
    parsed = ParseTorchSaveTensor(
        w.size, [&w](uint64_t o, std::span<std::byte> dst) { return w.Read(o, dst); });
    if (!parsed.ok()) {
      return parsed.status().With(ctx + ": encoded item bytes " +
                                  Range(e.encoded_offset, e.encoded_offset + e.encoded_length) +
                                  " (" + std::to_string(w.size) + " bytes decoded)");
    }
  } else {
    auto end = CheckedAddU(offset, length);
    if (!end || *end > file.size()) {
      return DataLossError(ctx + ": item bytes " + Range(offset, offset + length) +
                           " pass end of file (" + std::to_string(file.size()) + " bytes)");
    }
    const uint64_t tensor_bytes =
        CheckedMulU(static_cast<uint64_t>(chunk.stored_elements()), DTypeSize(dtype))
            .value_or(UINT64_MAX);
    const uint64_t window = ItemReader::WindowFor(length, tensor_bytes);
    ItemReader reader(&file, offset, length, window);
    reader.SetPrefix(item_prefix);
    // The blob probe goes through the reader: its head window then serves data.pkl too.
    bool blob = false;
    if (length >= 9) {
      std::byte head[9];
      FC_RETURN_IF_ERROR(reader.Read(0, head).With(ctx));
      blob = IsSafetensorsBlobHead(head);
    } else {
      FC_ASSIGN_OR_RETURN(blob, IsSafetensorsBlob(file, offset).With(ctx));
    }
    if (blob) return LocateInSafetensorsBlob(file, offset, key, chunk, dtype).With(ctx);
    ZipLimits limits;
    limits.first_tail_bytes = std::min(window, limits.first_tail_bytes);
    parsed = ParseTorchSaveTensor(length, reader.AsZipReadFn(), limits, refs);
    if (!parsed.ok()) {
      return parsed.status().With(ctx + ": item bytes " + Range(offset, offset + length));
    }
  }
  const TorchSaveTensor& t = *parsed;
  if (t.ref.dtype != dtype) {
    return DataLossError(ctx + ": item dtype " + std::string(DTypeName(t.ref.dtype)) +
                         " != metadata dtype " + std::string(DTypeName(dtype)));
  }
  // (A flattened range may also be a 1-D item of its length: a piece of a Megatron
  // dp_reshardable bucket mapped to its param, megatron_buckets.h.)
  if (t.ref.shape != DcpChunkSizes(chunk) &&
      !(chunk.flat_range && t.ref.shape == Shape{chunk.flat_range->size()})) {
    return DataLossError(ctx + ": item tensor shape " + ShapeText(t.ref.shape) +
                         " != chunk sizes " + ShapeText(DcpChunkSizes(chunk)));
  }
  if (chunk.flat_range && !t.ref.IsRowMajorContiguous()) {
    return UnimplementedError(ctx + ": a strided item of a flattened range");
  }
  // In range: the view lies inside the storage record, which lies inside the item.
  ChunkLocation loc;
  loc.byte_offset = offset + t.first_element_offset;
  loc.byte_length = t.ref.ViewSpanBytes();
  if (!t.ref.IsRowMajorContiguous()) loc.strides = t.ref.strides;
  return loc;
}

}  // namespace fc
