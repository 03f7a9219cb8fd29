// Megatron rank files (rank_file.h): opening, args, the allow-list of globals.
#include "src/format/megatron/rank_file.h"

#include <cstring>
#include <set>
#include <span>
#include <utility>

namespace fc::megatron_internal {
namespace {

constexpr uint64_t kMaxPickleBytes = uint64_t{256} << 20;

}  // namespace

bool AllowedGlobal(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kAllowed = {
      {"collections", "OrderedDict"},
      {"torch", "Size"},
      {"torch", "device"},
      {"__builtin__", "set"}, {"builtins", "set"},
      {"__builtin__", "frozenset"}, {"builtins", "frozenset"},
      {"__builtin__", "bytes"}, {"builtins", "bytes"},
      // getattr(SomeEnum, 'member'): an Enum member pickled by Python >= 3.11; never called,
      // and the enum class itself is reported when it is not allowed.
      {"__builtin__", "getattr"}, {"builtins", "getattr"},
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
  if (module == "torch" && TorchDTypeFromName(name).ok()) return true;  // params_dtype
  return false;
}


// A value pickled by torch.save for a tensor: REDUCE of a torch rebuild function.
bool LooksLikeTensor(const PV& v) {
  const PV* g = v.CalleeGlobal();
  return v.kind == PV::Kind::kCall && g != nullptr &&
         (g->str == "torch._utils" || g->str == "torch._tensor");
}

std::optional<int64_t> ScalarStep(const RankFile& f, const PV& v) {
  auto l = f.Locate(v, "step");
  if (!l.ok()) return std::nullopt;
  for (int64_t d : l->shape) {
    if (d != 1) return std::nullopt;
  }
  std::byte b[8];
  const size_t size = DTypeSize(l->dtype);
  if (size > sizeof b || l->first + size > f.file->size() ||
      !f.file->ReadAt(l->first, std::span<std::byte>(b, size)).ok()) {
    return std::nullopt;
  }
  double x;
  if (l->dtype == DType::kFloat32) {
    float g;
    std::memcpy(&g, b, 4);
    x = g;
  } else if (l->dtype == DType::kFloat64) {
    std::memcpy(&x, b, 8);
  } else if (l->dtype == DType::kInt64) {
    int64_t i;
    std::memcpy(&i, b, 8);
    return i;
  } else {
    return std::nullopt;
  }
  if (!(x >= 0 && x < 9.0e15) || x != static_cast<double>(static_cast<int64_t>(x))) {
    return std::nullopt;
  }
  return static_cast<int64_t>(x);
}

// `state_dict`: the root must be a dict (model_optim_rng.pt); distrib_optim.pt may also be
// a list (a ChainedOptimizer's).
Result<std::unique_ptr<RankFile>> OpenRankFile(const std::string& dir, const std::string& rel,
                                               uint32_t index, bool state_dict) {
  auto rf = std::make_unique<RankFile>();
  rf->rel = rel;
  rf->index = index;
  FC_ASSIGN_OR_RETURN(rf->file, RandomAccessFile::Open(dir + "/" + rel));
  const RandomAccessFile* f = rf->file.get();
  ZipReadFn read = [f](uint64_t off, std::span<std::byte> dst) { return f->ReadAt(off, dst); };
  if (f->size() >= 2) {
    std::byte magic[2];
    FC_RETURN_IF_ERROR(f->ReadAt(0, magic));
    if (magic[0] == std::byte{0x80}) {
      return UnimplementedError(rel + ": a legacy (non-zip) torch.save file "
                                "(_use_new_zipfile_serialization=False); fc reads Megatron "
                                "checkpoints saved as torch.save zips (torch >= 1.6)");
    }
  }
  auto archive = ReadTorchSaveArchive(f->size(), read);
  if (!archive.ok()) return archive.status().With(rel);
  rf->archive = std::move(*archive);
  auto root = ReadTorchSavePickle(rf->archive, read, kMaxPickleBytes);
  if (!root.ok()) return root.status().With(rel);
  rf->root = std::move(*root);
  if (state_dict && DictEntries(&rf->root) == nullptr) {
    return DataLossError(rel + ": the saved object is " + rf->root.DebugString() +
                         ", expected Megatron's state dict (a dict with args, model, ...)");
  }
  return rf;
}

// args: an argparse.Namespace (NEWOBJ + BUILD of its __dict__) or a plain dict.
const PV* ArgsDict(const RankFile& f) {
  const PV* a = f.root.Find("args");
  if (a == nullptr) return nullptr;
  if (DictEntries(a) != nullptr) return a;
  const PV* g = a->CalleeGlobal();
  if (g != nullptr && g->IsGlobal("argparse", "Namespace") && a->state &&
      DictEntries(a->state.get()) != nullptr) {
    return a->state.get();
  }
  return nullptr;
}

}  // namespace fc::megatron_internal
