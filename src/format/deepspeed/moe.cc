// MoE checkpoints: the expert files (one expert's 16-bit weights each) and, with ZeRO 1/2 or
// BF16_Optimizer at one model-parallel rank, the optimizer partitions of the dense and expert
// param groups.
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
#include "src/format/deepspeed/names.h"
#include "src/format/deepspeed/rank_partition.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

namespace {

// ds_config use_data_before_expert_parallelism, which every optimizer file must agree on.
Result<bool> DataBeforeExpert(const std::vector<const PtFile*>& optims) {
  std::optional<bool> data_before_expert;
  for (const PtFile* f : optims) {
    bool flag = false;
    const PV* cfg = f->root.Find("ds_config");
    const PV* v = cfg ? cfg->Find("use_data_before_expert_parallelism") : nullptr;
    if (v != nullptr && !v->is_none()) {
      if (v->kind != PV::Kind::kBool) {
        return DataLossError(f->name + ": ds_config use_data_before_expert_parallelism is " +
                             v->DebugString() + ", expected a bool");
      }
      flag = v->bool_value;
    }
    if (data_before_expert && *data_before_expert != flag) {
      return DataLossError(f->name + ": ds_config use_data_before_expert_parallelism differs "
                           "from " + optims[0]->name + "'s");
    }
    data_before_expert = flag;
  }
  return *data_before_expert;
}

// partition_count: a list per group (an int: every group over all W ranks), equal in every
// optimizer file.
Result<std::vector<int64_t>> PartitionCounts(const std::vector<const PtFile*>& optims,
                                             const std::vector<const PV*>& osds,
                                             size_t ngroups) {
  const int64_t ws = static_cast<int64_t>(optims.size());
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < ws; ++r) {
    const PtFile& f = *optims[static_cast<size_t>(r)];
    const PV* pc = osds[static_cast<size_t>(r)]->Find("partition_count");
    std::vector<int64_t> c;
    if (auto one = IntOf(pc)) c.assign(ngroups, *one);
    if (const auto* items = PickleListItems(pc)) {
      for (const auto& i : *items) {
        auto v = IntOf(i.get());
        if (!v) break;
        c.push_back(*v);
      }
    }
    if (c.size() != ngroups) {
      return DataLossError(f.name + ": partition_count is " +
                           (pc ? pc->DebugString() : std::string("missing")) +
                           ", expected one count per param group (" + std::to_string(ngroups) +
                           ")");
    }
    if (r > 0 && c != counts) {
      return DataLossError(f.name + ": partition_count " + pc->DebugString() + " differs from " +
                           optims[0]->name + "'s");
    }
    counts = std::move(c);
  }
  return counts;
}

// Whether param group g, partitioned over `count` of the `ws` ranks (ep = ws / count), is an
// expert group: ep > 1 or moe: True in its param group (which must then agree with ep).
Result<bool> IsExpertGroup(const std::vector<const PtFile*>& optims,
                           const std::vector<PV::Ptr>* param_groups, size_t g, int64_t count,
                           int64_t ws) {
  const std::string gs = std::to_string(g);
  const int64_t ep = ws / count;
  bool expert_group = ep > 1;
  if (param_groups != nullptr && g < param_groups->size()) {
    const PV* pg = (*param_groups)[g].get();
    const PV* moe = pg->Find("moe");
    const bool flagged = moe != nullptr && moe->kind == PV::Kind::kBool && moe->bool_value;
    if (ep > 1 && !flagged) {
      return DataLossError(optims[0]->name + ": param group " + gs + " is partitioned over " +
                           std::to_string(count) + " of " + std::to_string(ws) +
                           " ranks but is not an expert group (no moe: True)");
    }
    expert_group = expert_group || flagged;
    auto name = PickleStr(pg->Find("name"));
    if (flagged && name && name->starts_with("ep_size_") &&
        *name != "ep_size_" + std::to_string(ep)) {
      return DataLossError(optims[0]->name + ": param group " + gs + " is named '" + *name +
                           "' but partition_count " + std::to_string(count) + " of " +
                           std::to_string(ws) + " ranks means ep_size " + std::to_string(ep));
    }
  }
  return expert_group;
}

// Local expert k of expert-parallel rank e -> global expert e * local + k: the name of param
// `local` (of an expert group of `ep` ranks) in the expert files; other names stay.
// `experts`: per expert module prefix, its number of experts. `where`: the file.
Result<std::string> GlobalExpertName(const std::map<std::string, int64_t>& experts,
                                     bool expert_group, int64_t ep, const std::string& local,
                                     int64_t e, const std::string& where) {
  const std::optional<ExpertName> x = ParseExpertName(local);
  if (!expert_group || !x) return local;
  auto it = experts.find(x->prefix);
  if (it == experts.end()) {
    return DataLossError(where + ": expert param '" + local + "', but no layer_*_expert_* "
                         "file holds experts named " + x->prefix + "<id>.*");
  }
  if (it->second % ep != 0) {
    return DataLossError(where + ": " + std::to_string(it->second) + " experts of " +
                         x->prefix + "* do not split over " + std::to_string(ep) +
                         " expert-parallel ranks");
  }
  const int64_t per_rank = it->second / ep;
  if (x->id >= per_rank) {
    return DataLossError(where + ": local expert " + std::to_string(x->id) + " in '" + local +
                         "', but each of the " + std::to_string(ep) +
                         " expert-parallel ranks holds " + std::to_string(per_rank));
  }
  return x->prefix + std::to_string(e * per_rank + x->id) + x->rest;
}

// A param's piece in one partition of an expert-parallel rank's group.
struct Fragment {
  size_t j;  // the partition
  int64_t numel, start;  // start: in the partition
};

// The params of a group's partitions (of ranks `members`) in order of first appearance, and
// each one's fragments, from param_slice_mappings.
struct ExpertFragments {
  std::vector<std::string> order;
  std::map<std::string, std::vector<Fragment>> frags;
};

Result<ExpertFragments> CollectFragments(const std::vector<const PtFile*>& optims,
                                         const std::vector<const PV*>& osds,
                                         const std::vector<size_t>& members,
                                         const std::vector<RankPart>& parts, size_t g) {
  const std::string gs = std::to_string(g);
  ExpertFragments out;
  std::vector<std::string>& order = out.order;
  std::map<std::string, std::vector<Fragment>>& frags = out.frags;
  for (size_t j = 0; j < members.size(); ++j) {
    const PtFile& f = *optims[members[j]];
    const std::string where = f.name + ": param_slice_mappings[" + gs + "]";
    const auto* all = PickleListItems(osds[members[j]]->Find("param_slice_mappings"));
    if (all == nullptr || g >= all->size()) {
      return UnimplementedError(where + " is missing: without param_shapes (a MoE "
                                "checkpoint has none) it is what names the params of a "
                                "partition (DeepSpeed >= 0.7 saves it)");
    }
    const PickleEntries* entries = PickleDictEntries((*all)[g].get());
    if (entries == nullptr) return DataLossError(where + " is " + (*all)[g]->DebugString());
    for (const auto& [k, v] : *entries) {
      auto name = PickleStr(k.get());
      auto frag = FragmentOf(v.get());
      if (!name || !frag) {
        return DataLossError(where + ": entry " + k->DebugString() + ": " + v->DebugString() +
                             " is not name: fragment_address(numel, start)");
      }
      const auto [numel, start] = *frag;
      if (numel <= 0 || start < 0 || start > parts[j].lean - numel) {
        return DataLossError(where + ": '" + *name + "' fragment_address(numel=" +
                             std::to_string(numel) + ", start=" + std::to_string(start) +
                             ") is outside the partition's " + std::to_string(parts[j].lean) +
                             " elements");
      }
      auto [it, fresh] = frags.try_emplace(*name);
      if (fresh) order.push_back(*name);
      it->second.push_back({j, numel, start});
    }
  }
  return out;
}

}  // namespace

// MoE with ZeRO 1/2 or BF16_Optimizer (DeepSpeedEngine._save_moe_checkpoint +
// _save_zero_checkpoint; not in deepspeed.md: from DeepSpeed's source, stage_1_and_2.py and
// bf16_optimizer.py _configure_moe_settings (BF16_Optimizer since DeepSpeed PR #5259, 2024),
// moe/utils.py split_params_into_different_moe_groups_for_optimizer, utils/groups.py
// _create_expert_and_data_parallel). The param groups are the dense groups, then the expert
// groups (name "ep_size_<E>", moe True). A dense group is cut over all W DP ranks like any
// ZeRO group. An expert group holds only the rank's own (local) experts and is cut over its
// expert-data-parallel group: partition_count[g] = W / E. Rank R is expert-parallel rank
// R % E and expert-DP rank R / E (DeepSpeed's default), or, with
// use_data_before_expert_parallelism in ds_config, R / (W/E) and R % (W/E). The model states
// carry no param_shapes: the params, their order and offsets come from param_slice_mappings
// (required here), their shapes from the module and the expert files. Local expert k of
// expert-parallel rank e is global expert e * (experts / E) + k, the name the expert files
// use (_save_moe_checkpoint).
Status Reader::ReadMoeZero12(const std::vector<const PtFile*>& optims,
                             const std::vector<const PV*>& osds, bool bf16_optimizer) {
  const int64_t ws = static_cast<int64_t>(optims.size());
  FC_ASSIGN_OR_RETURN(const bool data_before_expert, DataBeforeExpert(optims));
  const auto* singles0 = PickleListItems(osds[0]->Find("single_partition_of_fp32_groups"));
  if (singles0 == nullptr) {
    return DataLossError(optims[0]->name + ": no single_partition_of_fp32_groups list");
  }
  const size_t ngroups = singles0->size();
  FC_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, PartitionCounts(optims, osds, ngroups));
  const PV* base0 = osds[0]->Find("base_optimizer_state");
  const auto* param_groups = PickleListItems(base0 ? base0->Find("param_groups") : nullptr);
  int64_t max_ep = 1;
  for (size_t g = 0; g < ngroups; ++g) {
    const std::string gs = std::to_string(g);
    const int64_t count = counts[g];
    if (count <= 0 || ws % count != 0) {
      return DataLossError(optims[0]->name + ": partition_count[" + gs + "] = " +
                           std::to_string(count) + " does not divide the " + std::to_string(ws) +
                           " DP ranks' files");
    }
    const int64_t ep = ws / count;
    FC_ASSIGN_OR_RETURN(const bool expert_group,
                        IsExpertGroup(optims, param_groups, g, count, ws));
    max_ep = std::max(max_ep, ep);
    for (int64_t e = 0; e < ep; ++e) {
      FC_RETURN_IF_ERROR(ReadMoeGroupPart(optims, osds, MoeGroupPart{g, ngroups, count, ep, e,
                                                                     expert_group,
                                                                     data_before_expert},
                                          bf16_optimizer));
    }
  }
  moe_optimizer_read_ = true;
  index_.attributes["deepspeed.ep_degree"] = std::to_string(max_ep);
  index_.attributes["deepspeed.moe_topology"] =
      data_before_expert
          ? "data before expert (use_data_before_expert_parallelism): rank R is expert-parallel "
            "rank R / (dp / ep)"
          : "expert before data (DeepSpeed's default): rank R is expert-parallel rank R % ep";
  return Status::Ok();
}

Status Reader::ReadMoeGroupPart(const std::vector<const PtFile*>& optims,
                                const std::vector<const PV*>& osds, const MoeGroupPart& part,
                                bool bf16_optimizer) {
  const auto [g, ngroups, count, ep, e, expert_group, data_before_expert] = part;
  const std::string gs = std::to_string(g);
  std::vector<size_t> members;  // partition j -> rank
  for (int64_t j = 0; j < count; ++j) {
    members.push_back(static_cast<size_t>(data_before_expert ? e * count + j : e + j * ep));
  }
  std::vector<RankPart> parts;
  for (size_t m : members) {
    FC_ASSIGN_OR_RETURN(RankPart p, LoadRankPart(*optims[m], osds[m], g, ngroups,
                                                 optims[0]->name, bf16_optimizer));
    parts.push_back(p);
  }
  const int64_t ps = parts[0].padded;
  FC_ASSIGN_OR_RETURN(ExpertFragments fragments,
                      CollectFragments(optims, osds, members, parts, g));
  const std::vector<std::string>& order = fragments.order;
  std::map<std::string, std::vector<Fragment>>& frags = fragments.frags;
  // Params lie back to back from flat element 0 (flatten_dense_tensors_aligned), each
  // cut into consecutive fragments of consecutive partitions.
  int64_t off = 0;
  ParamList params;
  for (const std::string& local : order) {
    const std::vector<Fragment>& fs = frags[local];
    const PtFile& first = *optims[members[fs[0].j]];
    FC_ASSIGN_OR_RETURN(std::string name,
                        GlobalExpertName(moe_experts_, expert_group, ep, local, e, first.name));
    int64_t at = off;
    for (const Fragment& fr : fs) {
      const int64_t pos = static_cast<int64_t>(fr.j) * ps + fr.start;
      if (pos != at) {
        return DataLossError(optims[members[fr.j]]->name + ": param_slice_mappings[" + gs +
                             "]: '" + local + "' starts at flat element " +
                             std::to_string(pos) + " of the group, expected " +
                             std::to_string(at) + " (params back to back)");
      }
      at += fr.numel;
    }
    auto shape = moe_shapes_.find(name);
    if (shape == moe_shapes_.end()) {
      return DataLossError(first.name + ": param '" + name + "'" +
                           (name != local ? " (local '" + local + "')" : std::string()) +
                           " of param group " + gs +
                           " is in no module or expert file, so its shape is unknown");
    }
    const int64_t n = *CheckedNumElements(shape->second);
    if (n != at - off) {
      return DataLossError(first.name + ": param '" + name + "' has " +
                           std::to_string(at - off) + " elements in the partitions of group " +
                           gs + ", its module tensor " + ShapeText(shape->second) + " has " +
                           std::to_string(n));
    }
    for (const Fragment& fr : fs) {
      const RankPart& p = parts[fr.j];
      const PtFile& f = *optims[members[fr.j]];
      const int64_t lo = static_cast<int64_t>(fr.j) * ps + fr.start - off;
      FC_RETURN_IF_ERROR(AddFlatParam(f, p.fp32, p.exp_avg ? &*p.exp_avg : nullptr,
                                      p.exp_avg_sq ? &*p.exp_avg_sq : nullptr, name,
                                      shape->second, FlatRange{lo, lo + fr.numel}, fr.start));
    }
    params.emplace_back(name, shape->second);
    off = at;
  }
  for (size_t j = 0; j < members.size(); ++j) {
    const int64_t want = std::clamp<int64_t>(off - static_cast<int64_t>(j) * ps, 0, ps);
    if (parts[j].padded != ps || parts[j].lean != want) {
      return DataLossError(optims[members[j]]->name + ": group " + gs + " partition " +
                           std::to_string(j) + " holds " + std::to_string(parts[j].lean) +
                           " elements + " + std::to_string(parts[j].padded - parts[j].lean) +
                           " padding; its params' " + std::to_string(off) +
                           " elements over " + std::to_string(count) + " partitions of " +
                           std::to_string(ps) + " need " + std::to_string(want) + " + " +
                           std::to_string(ps - want));
    }
  }
  master_dtype_ = std::string(DTypeName(parts[0].fp32.dtype));
  FC_RETURN_IF_ERROR(AddStep(*optims[members[0]], parts[0].state, static_cast<int64_t>(g),
                             params));
  return Status::Ok();
}

// MoE expert files: each a state dict of one expert's params under their full names (the
// global expert id in the name), 16-bit like the module weights.
Status Reader::AddExpertFiles(const std::vector<const PtFile*>& files) {
  for (const PtFile* f : files) {
    const PickleEntries* entries = PickleDictEntries(&f->root);
    if (entries == nullptr) {
      return DataLossError(f->name + ": holds " + f->root.DebugString() +
                           ", expected the expert's state dict");
    }
    for (const auto& [k, v] : *entries) {
      auto name = PickleStr(k.get());
      if (!name) return DataLossError(f->name + ": state dict key " + k->DebugString());
      if (v->is_none()) continue;
      FC_ASSIGN_OR_RETURN(Located l, f->Locate(v.get(), "['" + *name + "']"));
      if (module_.Has("module." + *name)) {
        return DataLossError(f->name + ": '" + *name + "' is also in another model states or "
                             "expert file");
      }
      if (module_dtype_.empty()) module_dtype_ = std::string(DTypeName(l.dtype));
      const Chunk c = WholeChunk(l, f->index);
      FC_RETURN_IF_ERROR(module_.Add("module." + *name, l.dtype, l.shape, c, f->name));
      if (!weights_.Has(*name) && !frozen_.Has(*name)) {
        FC_RETURN_IF_ERROR(other_.Add(*name, l.dtype, l.shape, c, f->name));
      }
    }
  }
  return Status::Ok();
}

// MoE: the module and expert tensors' shapes and each expert module's number of experts
// (for ReadMoeZero12), and the attributes saying what is read.
Status Reader::PrepareMoe(DirFiles& files, const PtFile* first_model) {
  const std::string& dir = dir_;
  const std::map<int64_t, RankFiles>& ranks = files.ranks;
  auto& experts = files.experts;
  const bool moe = files.moe;
  if (moe_) {
    // Shapes of the module and expert tensors, and the number of experts of each expert
    // module, for ReadMoeZero12.
    auto add_shapes = [&](const PtFile& f, const PickleEntries* entries) -> Status {
      for (const auto& [k, v] : entries ? *entries : PickleEntries()) {
        auto name = PickleStr(k.get());
        if (!name || v->is_none()) continue;
        FC_ASSIGN_OR_RETURN(Located l, f.Locate(v.get(), "['" + *name + "']"));
        moe_shapes_[*name] = l.shape;
      }
      return Status::Ok();
    };
    if (const PtFile* m = ranks.begin()->second.model) {
      FC_RETURN_IF_ERROR(add_shapes(*m, PickleDictEntries(m->root.Find("module"))));
    }
    std::map<std::string, std::set<int64_t>> ids;
    for (const PtFile* f : experts[0]) {
      FC_RETURN_IF_ERROR(add_shapes(*f, PickleDictEntries(&f->root)));
      for (const auto& [k, v] : PickleDictEntries(&f->root) ? *PickleDictEntries(&f->root) : PickleEntries()) {
        auto name = PickleStr(k.get());
        if (auto x = name ? ParseExpertName(*name) : std::nullopt) ids[x->prefix].insert(x->id);
      }
    }
    for (const auto& [prefix, set] : ids) {
      const int64_t n = static_cast<int64_t>(set.size());
      if (*set.rbegin() != n - 1) {
        return NotFoundError(dir + ": the expert files hold " + std::to_string(n) +
                             " experts of " + prefix + "* but the highest id is " +
                             std::to_string(*set.rbegin()) + " (an expert file is missing)");
      }
      moe_experts_[prefix] = n;
    }
  }
  if (moe && (!moe_ || ranks.begin()->second.optim.empty())) {
    SetAttr("deepspeed.optimizer", "not read (MoE)", dir);
    SetAttr("deepspeed.zero_stage", "not read (MoE)", dir);
  }
  if (moe) {
    if (auto dp = IntOf(first_model ? first_model->root.Find("dp_world_size") : nullptr)) {
      SetAttr("deepspeed.dp_degree", std::to_string(*dp), first_model->name);
    }
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
