// The non-distributed optimizers' states in model_optim_rng.pt (reader.h): the Float16
// optimizer's ({optimizer: {state, param_groups}, fp32_from_fp16_params}) and the
// FP32Optimizer's ({state, param_groups}).
#include <algorithm>
#include <set>

#include "src/codec/json_util.h"
#include "src/format/megatron/master_check.h"
#include "src/format/megatron/optimizer_states.h"
#include "src/format/megatron/reader.h"

namespace fc::megatron_internal {
namespace {

using json_internal::ShapeText;

// A param group's kind from its keys.
struct GroupKind {
  std::optional<bool> no_wd, expert, decoupled;
};

// Each group's kind from its keys (`groups`, a list); `decoupled_used`: whether a group has
// is_decoupled_lr set.
Result<std::vector<GroupKind>> ParamGroupKinds(const PV* groups, const std::string& rel,
                                               bool* decoupled_used) {
  std::vector<GroupKind> kinds;
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const PV* grp = groups->items[g].get();
    if (grp == nullptr || PickleDictEntries(grp) == nullptr) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " is not a dict");
    }
    GroupKind k;
    if (auto lr = PickleNumber(grp->Find("lr_mult")); lr && *lr != 1.0) {
      return UnimplementedError(rel + ": param group " + std::to_string(g) + " has lr_mult " +
                                std::to_string(*lr) + " (scale_lr_cond: which params it holds "
                                "is not recorded)");
    }
    if (auto wd = PickleNumber(grp->Find("wd_mult"))) {
      k.no_wd = *wd == 0.0;
    } else if (groups->items.size() == 2) {
      k.no_wd = g == 1;  // the oldest form: [weight decay, no weight decay]
    } else {
      return UnimplementedError(rel + ": param group " + std::to_string(g) + " has no wd_mult");
    }
    k.expert = PickleBool(grp->Find("is_expert_parallel"));
    k.decoupled = PickleBool(grp->Find("is_decoupled_lr"));
    *decoupled_used |= k.decoupled.value_or(false);
    kinds.push_back(k);
  }
  return kinds;
}

}  // namespace

Status Reader::ReadFloat16Optimizer(const Grid& grid, const Pieces& pieces, int64_t vpp) {
  for (const auto& [pet, f] : grid) {
    const auto [p, e, t] = pet;
    const PV* opt = f->root.Find("optimizer");
    const std::string rel = f->rel + ": optimizer";
    if (opt == nullptr) return DataLossError(f->rel + ": no 'optimizer'");
    bool has_experts = false;
    for (int64_t v = 0; v < vpp; ++v) {
      for (const Piece& pc : pieces.at({p, e, t, v})) has_experts |= IsExpertPiece(pc);
    }
    auto all = [](const Piece&) { return true; };
    auto dense_only = [](const Piece& pc) { return !IsExpertPiece(pc); };
    // EP rank 0 keeps the dense params' states; the other EP ranks their experts'.
    const bool ep_rank0 = e == 0;  // (a lambda cannot capture a structured binding in clang < 16)
    auto keep = [ep_rank0](const Piece& pc) { return ep_rank0 || IsExpertPiece(pc); };
    if (opt->is_list()) {
      // A ChainedOptimizer: [dense, expert] (expert parallelism puts the experts apart).
      if (opt->items.size() != (has_experts ? 2u : 1u) ||
          std::any_of(opt->items.begin(), opt->items.end(), [](const auto& i) { return !i; })) {
        return UnimplementedError(rel + " holds " + std::to_string(opt->items.size()) +
                                  " optimizers; fc reads a dense one and, with experts, an "
                                  "expert one");
      }
      if (e == 0) {
        FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt->items[0], rel + "[0]", dense_only,
                                            dense_only, pieces, p, e, t, vpp));
      }
      if (has_experts) {
        FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt->items[1], rel + "[1]", IsExpertPiece,
                                            IsExpertPiece, pieces, p, e, t, vpp));
      }
    } else {
      FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt, rel, all, keep, pieces, p, e, t, vpp));
    }
  }
  return Status::Ok();
}

// Megatron's param groups (megatron/core/optimizer _get_param_groups): trainable params in
// named_parameters order over the model chunks, a group per (wd_mult, lr_mult,
// is_expert_parallel, is_decoupled_lr); no weight decay for ".bias" and 1-D params. The
// saved groups keep those keys (the oldest: two groups, weight decay first), so each param's
// group is the one whose keys match; group order does not matter. Indices into `state` are
// the groups' `params` lists; fp32_from_fp16_params[g] lists the group's 16-bit params'
// master weights in order. Checked: group sizes, shapes, and every master rounding to its
// model weight at both ends. The FP32Optimizer (training in fp32, no --fp16/--bf16) saves
// the torch optimizer's state dict itself, {state, param_groups}: every param is fp32 and
// its own master.
Status Reader::ReadFloat16State(const RankFile& f, const PV& state, const std::string& rel,
                                const std::function<bool(const Piece&)>& member,
                                const std::function<bool(const Piece&)>& keep,
                                const Pieces& pieces, int64_t p, int64_t e, int64_t t,
                                int64_t vpp) {
  const bool fp32_optimizer = IsFp32OptimizerState(state);
  const PV* inner = fp32_optimizer ? &state : state.Find("optimizer");
  const PV* masters = state.Find("fp32_from_fp16_params");
  const PV* groups = inner ? inner->Find("param_groups") : nullptr;
  const PV* states = inner ? inner->Find("state") : nullptr;
  if ((!fp32_optimizer && (masters == nullptr || !masters->is_list())) || groups == nullptr ||
      !groups->is_list() || PickleDictEntries(states) == nullptr) {
    return UnimplementedError(rel + " is not a Float16 optimizer's state ({optimizer: "
                              "{state, param_groups}, fp32_from_fp16_params}) nor an "
                              "FP32Optimizer's ({state, param_groups})");
  }
  if (!fp32_optimizer && masters->items.size() != groups->items.size()) {
    return DataLossError(rel + ": " + std::to_string(masters->items.size()) +
                         " fp32_from_fp16_params lists for " +
                         std::to_string(groups->items.size()) + " param groups");
  }
  struct Member {
    const Piece* piece;
    int64_t v;
    Located model;
  };
  bool decoupled_used = false;
  FC_ASSIGN_OR_RETURN(const std::vector<GroupKind> kinds,
                      ParamGroupKinds(groups, rel, &decoupled_used));
  std::vector<std::vector<Member>> members(kinds.size());
  for (int64_t v = 0; v < vpp; ++v) {
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      if (!member(pc)) continue;
      FC_ASSIGN_OR_RETURN(Located l, f.Locate(*pc.value, "'" + pc.name + "'"));
      const bool no_wd = pc.name.ends_with(".bias") || l.shape.size() == 1;
      const bool expert = IsExpertPiece(pc);
      const bool embedding = IsEmbeddingOrOutput(pc.name);
      std::optional<size_t> group;
      for (size_t g = 0; g < kinds.size(); ++g) {
        const GroupKind& k = kinds[g];
        if (*k.no_wd != no_wd || (k.expert && *k.expert != expert) ||
            (decoupled_used && k.decoupled.value_or(false) != embedding)) {
          continue;
        }
        if (group) {
          return UnimplementedError(rel + ": param groups " + std::to_string(*group) + " and " +
                                    std::to_string(g) + " both fit '" + pc.name + "'");
        }
        group = g;
      }
      if (!group) return DataLossError(rel + ": no param group fits '" + pc.name + "'");
      members[*group].push_back(Member{&pc, v, std::move(l)});
    }
  }
  std::set<int64_t> used_ids;
  for (size_t g = 0; g < kinds.size(); ++g) {
    const PV* ids_value = groups->items[g]->Find("params");
    const PV* fp32 = fp32_optimizer ? nullptr : masters->items[g].get();
    if (ids_value == nullptr || (!fp32_optimizer && fp32 == nullptr)) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " has no params list");
    }
    const PV& ids = *ids_value;
    if (!ids.is_list() || ids.items.size() != members[g].size()) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " holds " +
                           (ids.is_list() ? std::to_string(ids.items.size()) : std::string("no")) +
                           " params, the model " + std::to_string(members[g].size()) +
                           " of its kind (frozen params, or another grouping rule)");
    }
    size_t next_master = 0;
    for (size_t i = 0; i < members[g].size(); ++i) {
      const Member& m = members[g][i];
      const std::string& name = m.piece->name;
      std::array<Located, 3> located;
      if (m.model.dtype == DType::kFloat32) {
        located[0] = m.model;  // an fp32 param is its own master
      } else if (fp32_optimizer) {
        return DataLossError(rel + ": an FP32Optimizer's state ({state, param_groups}, no "
                             "fp32_from_fp16_params), but '" + name + "' is " +
                             std::string(DTypeName(m.model.dtype)));
      } else {
        if (!fp32->is_list() || next_master >= fp32->items.size() || !fp32->items[next_master]) {
          return DataLossError(rel + ": fp32_from_fp16_params[" + std::to_string(g) +
                               "] has no entry for '" + name + "'");
        }
        FC_ASSIGN_OR_RETURN(located[0], f.Locate(*fp32->items[next_master++],
                                                 "fp32 master of '" + name + "'"));
      }
      const std::optional<int64_t> id = ids.items[i] ? PickleInt(ids.items[i].get()) : std::nullopt;
      if (id && !used_ids.insert(*id).second) {
        return DataLossError(rel + ": state " + std::to_string(*id) + " is listed twice in the "
                             "param groups");
      }
      const PV* st = id ? PickleFindIntKey(states, *id) : nullptr;
      if (st == nullptr) {
        return UnimplementedError(rel + ": no Adam state for '" + name + "' (param " +
                                  (id ? std::to_string(*id) : std::string("?")) +
                                  "; a param without a gradient yet)");
      }
      for (size_t r = 1; r < 3; ++r) {
        const PV* tensor = st->Find(kOptimKeys[r]);
        if (tensor == nullptr || !LooksLikeTensor(*tensor)) {
          return DataLossError(rel + ": state of '" + name + "' has no " + std::string(kOptimKeys[r]));
        }
        FC_ASSIGN_OR_RETURN(located[r], f.Locate(*tensor, std::string(kOptimRoles[r]) + " of '" +
                                                              name + "'"));
      }
      for (const Located& l : located) {
        if (l.dtype != DType::kFloat32 || l.shape != m.model.shape) {
          return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                               ShapeText(l.shape) + ", the param " + ShapeText(m.model.shape) +
                               " (expected float32 of its shape)");
        }
      }
      if (m.model.dtype != DType::kFloat32) {  // an fp32 param is its own master
        // (The rounding check reads the master as contiguous.)
        if (!located[0].contiguous) {
          return UnimplementedError(located[0].where + " is a strided view");
        }
        FC_RETURN_IF_ERROR(CheckMasterRoundsToModel(*f.file, located[0], *f.file, m.model, name)
                               .With(rel));
      }
      if (keep(*m.piece)) optim_[{p, e, t, m.v, name}] = std::move(located);
    }
    if (fp32 != nullptr && fp32->is_list() && next_master != fp32->items.size()) {
      return DataLossError(rel + ": fp32_from_fp16_params[" + std::to_string(g) + "] has " +
                           std::to_string(fp32->items.size()) + " entries, the group " +
                           std::to_string(next_master) + " 16-bit params");
    }
  }
  return Status::Ok();
}

}  // namespace fc::megatron_internal
