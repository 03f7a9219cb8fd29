// Megatron rank files (rank_file.h): opening, locating, args.
#include "src/format/megatron/rank_file.h"

#include <cstring>
#include <span>
#include <utility>

namespace fc::megatron_internal {
namespace {

constexpr uint64_t kMaxPickleBytes = uint64_t{256} << 20;

}  // namespace

Result<Located> RankFile::Locate(const PV& v, const std::string& what) const {
  FC_ASSIGN_OR_RETURN(TorchSaveFileTensor t, TorchSaveFile::Locate(&v, what));
  return Located{std::move(t), index, rel + ": " + what};
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
  TorchSaveOpenOptions options;
  options.max_pickle_bytes = kMaxPickleBytes;
  options.refuse_legacy = "a legacy (non-zip) torch.save file "
                          "(_use_new_zipfile_serialization=False); fc reads Megatron "
                          "checkpoints saved as torch.save zips (torch >= 1.6)";
  FC_RETURN_IF_ERROR(OpenTorchSaveFile(dir + "/" + rel, rel, options, rf.get()));
  if (state_dict && PickleDictEntries(&rf->root) == nullptr) {
    return DataLossError(rel + ": the saved object is " + rf->root.DebugString() +
                         ", expected Megatron's state dict (a dict with args, model, ...)");
  }
  return rf;
}

// args: an argparse.Namespace (NEWOBJ + BUILD of its __dict__) or a plain dict.
const PV* ArgsDict(const RankFile& f) {
  const PV* a = f.root.Find("args");
  if (a == nullptr) return nullptr;
  if (PickleDictEntries(a) != nullptr) return a;
  const PV* g = a->CalleeGlobal();
  if (g != nullptr && g->IsGlobal("argparse", "Namespace") && a->state &&
      PickleDictEntries(a->state.get()) != nullptr) {
    return a->state.get();
  }
  return nullptr;
}

}  // namespace fc::megatron_internal
