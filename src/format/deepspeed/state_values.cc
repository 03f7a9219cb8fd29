// Values of DeepSpeed's state dicts. Contract: state_values.h.
#include "src/format/deepspeed/state_values.h"

#include <map>
#include <set>

#include "fc/codec/pickle_access.h"
#include "fc/core/checked_math.h"

namespace fc::deepspeed_internal {

namespace {

bool IsZeroStageEnum(const PV* g) {
  return g != nullptr && g->IsGlobal("deepspeed.runtime.zero.config", "ZeroStageEnum");
}

}  // namespace

std::optional<int64_t> IntOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int()) return v->int_value;
  if (v->kind == PV::Kind::kBool) return v->bool_value ? 1 : 0;
  if (v->kind == PV::Kind::kCall) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && (g->IsGlobal("builtins", "getattr") ||
                         g->IsGlobal("__builtin__", "getattr")) &&
        v->args && v->args->is_tuple() && v->args->items.size() == 2 &&
        IsZeroStageEnum(v->args->items[0].get()) && v->args->items[1]->is_str()) {
      static const std::map<std::string, int64_t> kMembers = {
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
      auto it = kMembers.find(v->args->items[1]->str);
      if (it != kMembers.end()) return it->second;
      return std::nullopt;
    }
    if (g != nullptr && g->str == "deepspeed.runtime.zero.config" && g->name == "ZeroStageEnum" &&
        v->args && v->args->is_tuple() && v->args->items.size() == 1 &&
        v->args->items[0]->is_int()) {
      return v->args->items[0]->int_value;
    }
  }
  return std::nullopt;
}

// fragment_address(numel, start), pickled as NEWOBJ + BUILD {numel, start}.
std::optional<std::pair<int64_t, int64_t>> FragmentOf(const PV* v) {
  const PV* st = v ? v->state.get() : nullptr;
  auto numel = IntOf(st ? st->Find("numel") : nullptr);
  auto start = IntOf(st ? st->Find("start") : nullptr);
  if (!numel || !start) return std::nullopt;
  return std::make_pair(*numel, *start);
}

Result<std::vector<ParamList>> ParamShapes(const PtFile& model) {
  const PV* ps = model.root.Find("param_shapes");
  std::vector<ParamList> groups;
  if (ps == nullptr || ps->is_none()) return groups;
  const auto* items = PickleListItems(ps);
  if (items == nullptr) {
    // A single dict (very old DeepSpeed) counts as one group.
    if (PickleDictEntries(ps) == nullptr) {
      return DataLossError(model.name + ": param_shapes is " + ps->DebugString() +
                           ", expected a list of dicts");
    }
  }
  std::vector<const PV*> dicts;
  if (items) for (const auto& i : *items) dicts.push_back(i.get());
  else dicts.push_back(ps);
  for (size_t g = 0; g < dicts.size(); ++g) {
    const PickleEntries* e = PickleDictEntries(dicts[g]);
    if (e == nullptr) {
      return DataLossError(model.name + ": param_shapes[" + std::to_string(g) + "] is " +
                           dicts[g]->DebugString() + ", expected a dict");
    }
    ParamList list;
    for (const auto& [k, v] : *e) {
      auto name = PickleStr(k.get());
      auto shape = PickleShape(v.get());
      if (!name || !shape) {
        return DataLossError(model.name + ": param_shapes[" + std::to_string(g) + "] entry " +
                             k->DebugString() + ": " + v->DebugString() +
                             " is not name: torch.Size");
      }
      FC_RETURN_IF_ERROR_WITH(CheckedNumElements(*shape).status(),
                              model.name + ": param_shapes '" + *name + "'");
      list.emplace_back(*name, *shape);
    }
    groups.push_back(std::move(list));
  }
  return groups;
}

bool DeepSpeedAllowedGlobal(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kDeepSpeed = {
      // Only ever interpreted as an int (see IntOf); never called.
      {"deepspeed.runtime.zero.config", "ZeroStageEnum"},
      {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"},
      {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"},
      {"deepspeed.utils.tensor_fragment", "fragment_address"},
      {"deepspeed.checkpoint.universal_checkpoint", "SubparamShape"},
  };
  return TorchSaveDataGlobal(module, name) || kDeepSpeed.count({module, name}) > 0;
}

}  // namespace fc::deepspeed_internal
