// ZeRO-3 (deepspeed.md section 4): per sub-group one flat fp32 buffer per DP rank, each param
// cut into ceil(numel / dp) pieces (the last padded); frozen params likewise in the model
// states.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_access.h"
#include "fc/core/checked_math.h"
#include "src/codec/json_util.h"
#include "src/format/deepspeed/reader.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

Status Reader::ReadZero3(const std::vector<const PtFile*>& models,
                         const std::vector<const PtFile*>& optims,
                         const std::vector<const PV*>& osds) {
  const int64_t ws = static_cast<int64_t>(optims.size());
  FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(*models[0]));
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::string ks = std::to_string(k);
    // Per-param partition size and offset inside the sub-group's flat buffer.
    std::vector<int64_t> pss, offs;
    int64_t sum = 0;
    for (const auto& [n, s] : groups[k]) {
      const int64_t numel = *CheckedNumElements(s);
      const int64_t ps = numel / ws + (numel % ws != 0 ? 1 : 0);
      offs.push_back(sum);
      pss.push_back(ps);
      auto next = CheckedAdd(sum, ps);
      if (!next) return OutOfRangeError(models[0]->name + ": sub-group " + ks + " overflows");
      sum = *next;
    }
    for (int64_t r = 0; r < ws; ++r) {
      const PtFile& f = *optims[static_cast<size_t>(r)];
      const PV* osd = osds[static_cast<size_t>(r)];
      const auto* flats = PickleListItems(osd->Find("fp32_flat_groups"));
      if (flats == nullptr || flats->size() != groups.size()) {
        return DataLossError(f.name + ": fp32_flat_groups has " +
                             (flats ? std::to_string(flats->size()) : "no") +
                             " sub-groups, param_shapes has " + std::to_string(groups.size()));
      }
      std::vector<std::pair<Builder*, std::optional<Located>>> sources;
      FC_ASSIGN_OR_RETURN(Located fp32,
                          f.Locate((*flats)[k].get(), "fp32_flat_groups[" + ks + "]"));
      master_dtype_ = std::string(DTypeName(fp32.dtype));
      const PV* inner = osd->Find("optimizer_state_dict");
      const PV* state = inner ? PickleFindIntKey(inner->Find("state"), static_cast<int64_t>(k)) : nullptr;
      std::optional<Located> ea, eas;
      if (state != nullptr) {
        if (const PV* t = state->Find("exp_avg")) {
          FC_ASSIGN_OR_RETURN(ea, f.Locate(t, "optimizer_state_dict state[" + ks + "].exp_avg"));
        }
        if (const PV* t = state->Find("exp_avg_sq")) {
          FC_ASSIGN_OR_RETURN(eas,
                              f.Locate(t, "optimizer_state_dict state[" + ks + "].exp_avg_sq"));
        }
      }
      for (const auto& [what, l] : {std::pair<std::string, const Located*>{"fp32_flat_groups", &fp32},
                                    {"exp_avg", ea ? &*ea : nullptr},
                                    {"exp_avg_sq", eas ? &*eas : nullptr}}) {
        if (l != nullptr && (l->shape.size() != 1 || l->numel != sum)) {
          return DataLossError(f.name + ": " + what + " of sub-group " + ks + " has shape " +
                               ShapeText(l->shape) + ", expected [" + std::to_string(sum) +
                               "] (per-param ceil(numel/" + std::to_string(ws) + ") pieces)");
        }
      }
      for (size_t i = 0; i < groups[k].size(); ++i) {
        const auto& [name, shape] = groups[k][i];
        const int64_t n = *CheckedNumElements(shape);
        const int64_t ps = pss[i];
        const int64_t real = std::clamp<int64_t>(n - r * ps, 0, ps);
        if (real == 0) continue;
        FC_RETURN_IF_ERROR(AddFlatParam(f, fp32, ea ? &*ea : nullptr, eas ? &*eas : nullptr,
                                        name, shape, FlatRange{r * ps, r * ps + real}, offs[i]));
      }
      if (r == 0) FC_RETURN_IF_ERROR(AddStep(f, state, static_cast<int64_t>(k), groups[k]));
    }
  }
  return AddFrozenZero3(models);
}

// ZeRO-3 frozen params: each rank's model states hold its ceil-div partition (padded).
Status Reader::AddFrozenZero3(const std::vector<const PtFile*>& models) {
  const int64_t ws = static_cast<int64_t>(models.size());
  const PickleEntries* fshapes = PickleDictEntries(models[0]->root.Find("frozen_param_shapes"));
  if (fshapes != nullptr) {
    for (const auto& [key, v] : *fshapes) {
      auto name = PickleStr(key.get());
      auto shape = PickleShape(v.get());
      if (!name || !shape) {
        return DataLossError(models[0]->name + ": frozen_param_shapes entry " +
                             key->DebugString() + " is not name: torch.Size");
      }
      const int64_t n = *CheckedNumElements(*shape);
      const int64_t ps = n / ws + (n % ws != 0 ? 1 : 0);
      for (int64_t r = 0; r < ws; ++r) {
        const PtFile& m = *models[static_cast<size_t>(r)];
        const PV* frags = m.root.Find("frozen_param_fragments");
        FC_ASSIGN_OR_RETURN(Located l, m.Locate(frags ? frags->Find(*name) : nullptr,
                                                "frozen_param_fragments['" + *name + "']"));
        if (l.shape.size() != 1 || l.numel != ps) {
          return DataLossError(m.name + ": frozen_param_fragments['" + *name + "'] has shape " +
                               ShapeText(l.shape) + ", expected [" + std::to_string(ps) + "]");
        }
        const int64_t real = std::clamp<int64_t>(n - r * ps, 0, ps);
        if (real == 0) continue;
        FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(l, m.index, *shape, FlatRange{r * ps, r * ps + real},
                                               0, m.name + ": frozen '" + *name + "'"));
        FC_RETURN_IF_ERROR(frozen_.Add(*name, l.dtype, *shape, c, m.name));
      }
    }
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
