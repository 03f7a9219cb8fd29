// A torch.save file opened in place. Contract: include/fc/format/torch_save_file.h.
//
// Nothing in the file is trusted: storage sizes come from the tensors that use them and are
// checked against the zip records (or, legacy, the element counts written before the data)
// and the file size, so a located tensor never points outside its storage's bytes.
#include "fc/format/torch_save_file.h"

#include <algorithm>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "fc/codec/pickle_access.h"
#include "fc/codec/pickle_walk.h"
#include "fc/core/checked_math.h"

namespace fc {
namespace {

// A legacy file (layout in the header) into *pt: its object and storages. `head` holds the
// file's first bytes; kDataLoss when the pickles pass its end.
Status ReadLegacyHead(std::span<const std::byte> head, TorchSaveFile* pt) {
  size_t pos = 0;
  std::vector<PickleValue> parts;
  for (int i = 0; i < 5; ++i) {
    size_t used = 0;
    auto v = ParsePickle(head.subspan(pos), PickleLimits{}, &used);
    if (!v.ok()) return v.status();
    parts.push_back(std::move(*v));
    pos += used;
  }
  static const char kMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
  if (parts[0].kind != PickleValue::Kind::kBigInt || parts[0].str != std::string(kMagic, 10)) {
    return DataLossError("legacy torch.save magic number is " + parts[0].DebugString());
  }
  if (!parts[1].is_int() || parts[1].int_value != 1001) {
    return UnimplementedError("legacy torch.save protocol version " + parts[1].DebugString() +
                              " (fc reads 1001)");
  }
  if (const PickleValue* le = parts[2].Find("little_endian");
      le != nullptr && le->kind == PickleValue::Kind::kBool && !le->bool_value) {
    return UnimplementedError("legacy torch.save written on a big-endian machine");
  }
  pt->root = std::move(parts[3]);
  const auto* keys = PickleListItems(&parts[4]);
  if (keys == nullptr) {
    return DataLossError("legacy torch.save storage key list is " + parts[4].DebugString());
  }
  // Each storage's byte size, from the tensors that reference it.
  std::map<std::string, std::pair<uint64_t, uint64_t>> bytes;  // key -> (bytes, item size)
  std::unordered_set<const PickleValue*> seen;
  std::vector<const PickleValue*> stack = {&pt->root};
  while (!stack.empty()) {
    const PickleValue* v = stack.back();
    stack.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    if (v->kind == PickleValue::Kind::kCall) {
      if (auto ref = DecodeTorchTensor(*v); ref.ok()) {
        auto [it, fresh] = bytes.emplace(ref->storage_key,
                                         std::pair<uint64_t, uint64_t>{ref->storage_bytes,
                                                                       DTypeSize(ref->dtype)});
        if (!fresh && it->second.first != ref->storage_bytes) {
          return DataLossError("legacy torch.save storage '" + ref->storage_key +
                               "' has two sizes in the pickle");
        }
        continue;
      }
    }
    ForEachChild(*v, [&](const PickleValue* child) { stack.push_back(child); });
  }
  uint64_t off = pos;
  const uint64_t size = pt->file->size();
  for (const auto& k : *keys) {
    auto key = PickleStr(k.get());
    if (!key) return DataLossError("legacy torch.save storage key " + k->DebugString());
    auto it = bytes.find(*key);
    if (it == bytes.end()) {
      return DataLossError("legacy torch.save storage '" + *key + "' is used by no tensor");
    }
    if (off > size || size - off < 8) {
      return DataLossError("legacy torch.save storage '" + *key + "' starts past the end");
    }
    std::byte n[8];
    FC_RETURN_IF_ERROR(pt->file->ReadAt(off, n));
    uint64_t numel = 0;
    for (int b = 7; b >= 0; --b) numel = (numel << 8) | static_cast<uint64_t>(n[b]);
    off += 8;
    const auto [storage_bytes, item] = it->second;
    if (size - off < storage_bytes) {
      return DataLossError("legacy torch.save storage '" + *key + "' (" +
                           std::to_string(storage_bytes) + " bytes) passes the end of the file");
    }
    // The element count written before the data must name the pickle's bytes.
    if (numel > storage_bytes || numel * item != storage_bytes) {
      return DataLossError("legacy torch.save storage '" + *key + "' holds " +
                           std::to_string(numel) + " elements of " + std::to_string(item) +
                           " bytes, the pickle says " + std::to_string(storage_bytes) + " bytes");
    }
    if (!pt->legacy_storages.emplace(*key, std::pair{off, storage_bytes}).second) {
      return DataLossError("legacy torch.save storage '" + *key + "' listed twice");
    }
    off += storage_bytes;
  }
  pt->legacy = true;
  return Status::Ok();
}

Status ReadLegacy(uint64_t max_pickle_bytes, TorchSaveFile* pt) {
  // The pickles come first; read a growing prefix until they parse.
  const uint64_t size = pt->file->size();
  const uint64_t cap = std::min(size, max_pickle_bytes);
  uint64_t want = std::min<uint64_t>(cap, uint64_t{1} << 20);
  for (;;) {
    std::vector<std::byte> head(static_cast<size_t>(want));
    FC_RETURN_IF_ERROR(pt->file->ReadAt(0, head));
    pt->legacy_storages.clear();
    Status s = ReadLegacyHead(head, pt);
    if (s.ok()) return s;
    if (want >= cap) return s.With(pt->name);
    want = std::min(cap, want * 8);
  }
}

// The file offset of storage record data/<key> of a zip file.
Result<uint64_t> ZipStorage(const TorchSaveFile& f, const TorchTensorRef& ref,
                            const std::string& what) {
  const ZipEntry* e = f.archive.FindRecord("data/" + ref.storage_key);
  if (e == nullptr) {
    return DataLossError(f.name + ": " + what + ": storage record 'data/" + ref.storage_key +
                         "' is missing");
  }
  if (e->method != 0) {
    return UnimplementedError(f.name + ": " + what + ": storage record '" + e->name +
                              "' is compressed");
  }
  if (e->compressed_size != ref.storage_bytes) {
    return DataLossError(f.name + ": " + what + ": storage record '" + e->name + "' has " +
                         std::to_string(e->compressed_size) + " bytes, data.pkl says " +
                         std::to_string(ref.storage_bytes));
  }
  if (e->data_exclusive_max() > f.file->size()) {
    return DataLossError(f.name + ": " + what + ": storage record '" + e->name +
                         "' passes the end of the file");
  }
  return e->data_offset;
}

}  // namespace

Status OpenTorchSaveFile(const std::string& path, std::string name,
                         const TorchSaveOpenOptions& options, TorchSaveFile* out) {
  out->name = std::move(name);
  FC_ASSIGN_OR_RETURN(out->file, RandomAccessFile::Open(path));
  const RandomAccessFile* f = out->file.get();
  ZipReadFn read = [f](uint64_t off, std::span<std::byte> dst) { return f->ReadAt(off, dst); };
  if (f->size() >= 2) {
    std::byte magic[2];
    FC_RETURN_IF_ERROR(f->ReadAt(0, magic));
    // Legacy torch.save starts with a pickled magic number (protocol 2: 0x80 0x02).
    if (!options.refuse_legacy.empty()) {
      if (magic[0] == std::byte{0x80}) {
        return UnimplementedError(out->name + ": " + options.refuse_legacy);
      }
    } else if (magic[0] != std::byte{'P'} || magic[1] != std::byte{'K'}) {
      if (magic[0] == std::byte{0x80}) return ReadLegacy(options.max_pickle_bytes, out);
      return DataLossError(out->name + ": not a torch.save zip archive");
    }
  }
  auto archive = ReadTorchSaveArchive(f->size(), read);
  if (!archive.ok()) return archive.status().With(out->name);
  out->archive = std::move(*archive);
  auto root = ReadTorchSavePickle(out->archive, read, options.max_pickle_bytes);
  if (!root.ok()) return root.status().With(out->name);
  out->root = std::move(*root);
  return Status::Ok();
}

Result<TorchSaveFileTensor> TorchSaveFile::Locate(const PickleValue* v,
                                                const std::string& what) const {
  if (v == nullptr) return DataLossError(name + ": " + what + " is missing");
  auto ref = DecodeTorchTensor(*v);
  if (!ref.ok()) return ref.status().With(name + ": " + what);
  uint64_t data_offset = 0;
  if (legacy) {
    auto it = legacy_storages.find(ref->storage_key);
    if (it == legacy_storages.end()) {
      return DataLossError(name + ": " + what + ": storage '" + ref->storage_key +
                           "' is not in the file's storage list");
    }
    if (it->second.second != ref->storage_bytes) {
      return DataLossError(name + ": " + what + ": storage '" + ref->storage_key + "' has " +
                           std::to_string(it->second.second) + " bytes, the pickle says " +
                           std::to_string(ref->storage_bytes));
    }
    data_offset = it->second.first;
  } else {
    FC_ASSIGN_OR_RETURN(data_offset, ZipStorage(*this, *ref, what));
  }
  TorchSaveFileTensor l;
  l.dtype = ref->dtype;
  l.shape = ref->shape;
  l.strides = ref->strides;
  l.contiguous = ref->IsRowMajorContiguous();
  FC_ASSIGN_OR_RETURN(l.numel, CheckedNumElements(l.shape).With(name + ": " + what));
  // In range: DecodeTorchTensor checked that the view fits the storage.
  l.first = data_offset + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(l.dtype);
  l.span = ref->ViewSpanBytes();
  return l;
}

std::map<std::string, std::pair<uint64_t, uint64_t>> TorchSaveFile::StorageSpans() const {
  if (legacy) return legacy_storages;
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  const std::string data = archive.prefix + "/data/";
  for (const ZipEntry& e : archive.zip.entries) {
    if (e.name.starts_with(data) && e.method == 0) {
      out[e.name.substr(data.size())] = {e.data_offset, e.compressed_size};
    }
  }
  return out;
}

bool TorchSaveDataGlobal(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kAllowed = {
      {"collections", "OrderedDict"},
      {"torch", "Size"},
      {"torch", "device"},
      {"__builtin__", "set"}, {"builtins", "set"},
      // Only ever interpreted as getattr(SomeEnum, 'member') (an Enum member pickled by
      // Python >= 3.11); never called.
      {"__builtin__", "getattr"}, {"builtins", "getattr"},
      {"__builtin__", "frozenset"}, {"builtins", "frozenset"},
      {"__builtin__", "bytes"}, {"builtins", "bytes"},
      {"argparse", "Namespace"},
      // Protocol 2 writes bytes objects (numpy RNG key arrays) as _codecs.encode(str, enc).
      {"_codecs", "encode"},
      {"numpy.core.multiarray", "_reconstruct"},
      {"numpy._core.multiarray", "_reconstruct"},
      {"numpy.core.multiarray", "scalar"},
      {"numpy._core.multiarray", "scalar"},
      {"numpy", "ndarray"},
      {"numpy", "dtype"},
  };
  if (kAllowed.count({module, name})) return true;
  if (module == "torch._utils" && name.starts_with("_rebuild_")) return true;
  if (module == "torch._tensor" && name == "_rebuild_from_type_v2") return true;
  if (module == "torch" && (name.ends_with("Storage") || name == "Tensor")) return true;
  // torch dtypes (Megatron's args.params_dtype, DeepSpeed's bf16/fp16 flags).
  if (module == "torch" && TorchDTypeFromName(name).ok()) return true;
  return false;
}

}  // namespace fc
