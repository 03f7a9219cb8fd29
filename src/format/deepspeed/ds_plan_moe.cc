// The MoE (ZeRO 1/2, BF16_Optimizer) planner of the DeepSpeed writer. Contract:
// src/format/deepspeed/ds_planners.h.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_build.h"
#include "fc/io/file.h"
#include "src/format/deepspeed/ds_archive_builder.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_planners.h"
#include "src/format/deepspeed/ds_source_file.h"
#include "src/format/deepspeed/ds_tree_edit.h"
#include "src/format/deepspeed/ds_zero12_files.h"

namespace fc::deepspeed_writer_internal {
namespace {

// The DP rank files of a MoE job and what they agree on.
struct MoeSource {
  std::vector<SourceFile> files;
  bool bf16 = false;  // BF16_Optimizer: no zero_stage, fp32 partitions saved padded
  std::optional<bool> data_before_expert;
  std::vector<int64_t> counts;
  PV::Ptr fragment_cls;
};

// Per group: E, the old and new partition counts, and per expert-parallel rank the group's
// flat buffer.
struct MoeGroup {
  int64_t ep = 1, old_count = 0, new_count = 0;
  std::vector<GroupSource> per_ep;
};

// DP rank r's optimizer file `name`: checked against the ranks before it, added to moe.files.
Status AddMoeRankFile(const SourceFiles& sources, Repartitioner& rp, int64_t r,
                      const std::string& name, MoeSource& moe) {
  std::vector<SourceFile>& files = moe.files;
  bool& bf16 = moe.bf16;
  std::optional<bool>& data_before_expert = moe.data_before_expert;
  std::vector<int64_t>& counts = moe.counts;
  PV::Ptr& fragment_cls = moe.fragment_cls;
  FC_ASSIGN_OR_RETURN(SourceFile sf, sources.Open(name));
  rp.AddFile(sf);
  FC_RETURN_IF_ERROR(CheckNoRoundRobin(sf));
  const PV* osd = sf.root.Find("optimizer_state_dict");
  if (osd == nullptr || !osd->is_dict()) {
    return DataLossError(sf.path + ": no optimizer_state_dict dict");
  }
  if (osd->Find("fp32_flat_groups")) {
    return UnimplementedError(sf.path + ": MoE with ZeRO-3: not re-partitioned (MoE: ZeRO "
                              "stage 1/2 and BF16_Optimizer)");
  }
  FC_RETURN_IF_ERROR(BaseOptimizerState(sf, *osd, r, &bf16).status());
  bool flag = false;
  const PV* cfg = sf.root.Find("ds_config");
  const PV* v = cfg && cfg->is_dict() ? cfg->Find("use_data_before_expert_parallelism") : nullptr;
  if (v != nullptr && !v->is_none()) {
    if (v->kind != K::kBool) {
      return DataLossError(sf.path + ": ds_config use_data_before_expert_parallelism is " +
                           v->DebugString(20) + ", expected a bool");
    }
    flag = v->bool_value;
  }
  if (data_before_expert && *data_before_expert != flag) {
    return DataLossError(sf.path + ": ds_config use_data_before_expert_parallelism differs "
                         "between the DP ranks' files");
  }
  data_before_expert = flag;
  const PV* pc = osd->Find("partition_count");
  std::vector<int64_t> c;
  if (pc != nullptr && (pc->is_list() || pc->is_tuple())) {
    for (const PV::Ptr& i : pc->items) {
      if (!i->is_int()) break;
      c.push_back(i->int_value);
    }
    if (c.size() != pc->items.size()) c.clear();
  }
  if (c.empty() || (r > 0 && c != counts)) {
    return DataLossError(sf.path + ": partition_count " +
                         (pc ? pc->DebugString(60) : std::string("missing")) +
                         (r > 0 ? " differs from DP rank 0's" : " is not a list of counts"));
  }
  counts = std::move(c);
  if (const PV* maps = osd->Find("param_slice_mappings"); maps && !fragment_cls) {
    for (const PV::Ptr& gm : maps->items) {
      for (const auto& [k, fv] : gm->entries) {
        if (fv->kind == K::kObject && fv->callee) fragment_cls = fv->callee;
      }
    }
  }
  files.push_back(std::move(sf));
  return Status::Ok();
}

// Expert-parallel rank e's flat buffer of group g (mg.per_ep[e]): its params from
// param_slice_mappings, its old partitions as plan sources.
Status AddMoeEpSources(Repartitioner& rp, const MoeSource& moe, size_t g, int64_t e,
                       MoeGroup& mg) {
  const std::vector<SourceFile>& files = moe.files;
  const bool bf16 = moe.bf16;
  const std::optional<bool>& data_before_expert = moe.data_before_expert;
  const size_t ngroups = moe.counts.size();
  const std::string gl = "group " + std::to_string(g);
  auto member = [&](int64_t er, int64_t j, int64_t count, int64_t ep) {
    return *data_before_expert ? er * count + j : er + j * ep;
  };
  GroupSource& gs = mg.per_ep[static_cast<size_t>(e)];
  // The params: param_slice_mappings of the partitions in order, back to back.
  const int64_t count = mg.old_count;
  std::vector<const SourceFile*> parts;
  for (int64_t j = 0; j < count; ++j) parts.push_back(&files[member(e, j, count, mg.ep)]);
  std::vector<int64_t> lean(parts.size());
  for (size_t j = 0; j < parts.size(); ++j) {
    const PV* single = parts[j]->root.Find("optimizer_state_dict")
                           ->Find("single_partition_of_fp32_groups");
    if (single == nullptr || !single->is_list() || single->items.size() != ngroups) {
      return DataLossError(parts[j]->path + ": single_partition_of_fp32_groups is not a "
                           "list of " + std::to_string(ngroups));
    }
    FC_ASSIGN_OR_RETURN(Located l, LocateTensor(*parts[j], single->items[g].get(),
                                                "single_partition_of_fp32_groups[" +
                                                    std::to_string(g) + "]"));
    const PV* pads = parts[j]->root.Find("optimizer_state_dict")->Find("group_paddings");
    if (pads == nullptr || !pads->is_list() || pads->items.size() != ngroups ||
        !pads->items[g]->is_int() || pads->items[g]->int_value < 0 ||
        (bf16 && pads->items[g]->int_value > l.ref.shape[0])) {
      return DataLossError(parts[j]->path + ": group_paddings is not a list of " +
                           std::to_string(ngroups) + " paddings of its partitions");
    }
    // The real elements (BF16_Optimizer: the saved partition less its padding).
    lean[j] = l.ref.shape[0] - (bf16 ? pads->items[g]->int_value : 0);
  }
  int64_t ps_old = 0;
  {
    const PV* pads = parts[0]->root.Find("optimizer_state_dict")->Find("group_paddings");
    ps_old = lean[0] + pads->items[g]->int_value;
  }
  int64_t at = 0;
  std::map<std::string, size_t> seen;
  for (size_t j = 0; j < parts.size(); ++j) {
    const PV* maps = parts[j]->root.Find("optimizer_state_dict")->Find("param_slice_mappings");
    if (maps == nullptr || !maps->is_list() || maps->items.size() != ngroups) {
      return UnimplementedError(parts[j]->path + ": no param_slice_mappings for " +
                                std::to_string(ngroups) + " groups (a MoE checkpoint has "
                                "no param_shapes; they name the params)");
    }
    for (const auto& [k, fv] : maps->items[g]->entries) {
      const PV* st = fv->state.get();
      const PV* numel = st ? st->Find("numel") : nullptr;
      const PV* start = st ? st->Find("start") : nullptr;
      if (!k->is_str() || !numel || !numel->is_int() || !start || !start->is_int()) {
        return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                             std::to_string(g) + "] entry " + k->DebugString(40) +
                             " is not name: fragment_address(numel, start)");
      }
      const int64_t pos = static_cast<int64_t>(j) * ps_old + start->int_value;
      if (pos != at || numel->int_value <= 0 || start->int_value + numel->int_value > lean[j]) {
        return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                             std::to_string(g) + "]: '" + k->str + "' at flat element " +
                             std::to_string(pos) + " (" + std::to_string(numel->int_value) +
                             " elements), expected the params back to back from " +
                             std::to_string(at));
      }
      auto [it, fresh] = seen.try_emplace(k->str, gs.params.size());
      if (fresh) gs.params.emplace_back(k->str, 0);
      else if (it->second + 1 != gs.params.size()) {
        return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                             std::to_string(g) + "]: '" + k->str + "' is split around "
                             "another param");
      }
      gs.params[it->second].second += numel->int_value;
      at += numel->int_value;
    }
  }
  gs.orig = at;
  if (PaddedLength(gs.orig, count) / count != ps_old) {
    return DataLossError(parts[0]->path + ": " + gl + " partitions of " +
                         std::to_string(ps_old) + " elements, but its params' " +
                         std::to_string(gs.orig) + " elements over " +
                         std::to_string(count) + " ranks give " +
                         std::to_string(PaddedLength(gs.orig, count) / count));
  }
  for (size_t j = 0; j < parts.size(); ++j) {
    const SourceFile& sf = *parts[j];
    const PV* osd = sf.root.Find("optimizer_state_dict");
    const int64_t want = LeanLength(gs.orig, ps_old, static_cast<int64_t>(j));
    const PV* pads = osd->Find("group_paddings");
    if (lean[j] != want || pads == nullptr || !pads->is_list() ||
        pads->items.size() != ngroups || !pads->items[g]->is_int() ||
        pads->items[g]->int_value != ps_old - want) {
      return DataLossError(sf.path + ": " + gl + " partition holds " +
                           std::to_string(lean[j]) + " elements; the padding rule gives " +
                           std::to_string(want) + " + " + std::to_string(ps_old - want) +
                           " padding");
    }
    const PV* single = osd->Find("single_partition_of_fp32_groups");
    const PV* state = osd->Find("base_optimizer_state")->Find("state");
    const PV* st = nullptr;
    if (state != nullptr && state->is_dict()) {
      for (const auto& [sk, sv] : state->entries) {
        if (sk->is_int() && sk->int_value == static_cast<int64_t>(g)) st = sv.get();
      }
    }
    if (st == nullptr || !st->is_dict()) {
      return DataLossError(sf.path + ": base_optimizer_state.state has no " + gl);
    }
    FC_RETURN_IF_ERROR(AddPartitionSources(
        rp, sf, *single->items[g], *st, g, ps_old, lean[j], bf16, j == 0,
        "rank" + std::to_string(member(e, static_cast<int64_t>(j), count, mg.ep)) +
            ".group" + std::to_string(g) + ".",
        &gs));
  }
  return Status::Ok();
}

// New DP rank r's optimizer file, from DP rank 0's tree.
Status AddMoeNewRankFile(DsRepartition& job, int64_t r, const std::string& prefix,
                         const MoeSource& moe, const std::vector<MoeGroup>& groups) {
  const size_t ngroups = moe.counts.size();
  const bool bf16 = moe.bf16;
  const std::optional<bool>& data_before_expert = moe.data_before_expert;
  const PV::Ptr& fragment_cls = moe.fragment_cls;
  const SourceFile& rank0 = moe.files.front();
  const std::string name = prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00" +
                           "_optim_states.pt";
  ArchiveBuilder out(JoinPath(job.tag, name));
  PV singles, paddings, mappings, partition_count;
  singles.kind = paddings.kind = mappings.kind = partition_count.kind = K::kList;
  std::vector<PV::Ptr> ea(ngroups), eas(ngroups);
  for (size_t g = 0; g < ngroups; ++g) {
    const MoeGroup& mg = groups[g];
    const int64_t count = mg.new_count;
    const int64_t e = *data_before_expert ? r / count : r % mg.ep;
    const int64_t j = *data_before_expert ? r % count : r / mg.ep;
    const GroupSource& gs = mg.per_ep[static_cast<size_t>(e)];
    const int64_t ps = PaddedLength(gs.orig, count) / count;
    const int64_t lean = LeanLength(gs.orig, ps, j);
    const std::string gl = "rank " + std::to_string(r) + " group " + std::to_string(g);
    auto part = [&](const std::vector<int64_t>& sources, DType dtype, const char* what) {
      return Repartitioner::PartitionOver(gs, sources, dtype, mg.old_count, count, j,
                                          gl + " " + what);
    };
    singles.items.push_back(out.NewTensor(part(gs.fp32, gs.dtype, "fp32"), bf16 ? ps : lean,
                                          gs.storage_class));
    ea[g] = out.NewTensor(part(gs.exp_avg, gs.state_dtype, "exp_avg"), ps,
                          gs.state_storage_class);
    eas[g] = out.NewTensor(part(gs.exp_avg_sq, gs.state_dtype, "exp_avg_sq"), ps,
                           gs.state_storage_class);
    paddings.items.push_back(PickleInt(ps - lean));
    mappings.items.push_back(SliceMappings(gs, ps, j, fragment_cls));
    partition_count.items.push_back(PickleInt(count));
  }
  FC_RETURN_IF_ERROR(AddOptimStates(job, std::move(out), rank0, Node(std::move(singles)),
                                    Node(std::move(paddings)), Node(std::move(partition_count)),
                                    Node(std::move(mappings)), ea, eas));
  return Status::Ok();
}

}  // namespace

Status PlanMoeZero12(DsRepartition& job, const SourceFiles& sources, Repartitioner& rp, const std::string& model_name,
                     const std::map<int64_t, std::string>& ranks, const std::string& prefix) {
  const int64_t dp = job.dp;
  FC_ASSIGN_OR_RETURN(SourceFile model, sources.Open(model_name));
  rp.AddFile(model);
  if (!model.root.is_dict()) return DataLossError(model.path + ": not a dict");
  FC_RETURN_IF_ERROR(AddModelStates(job, model_name, model));
  FC_RETURN_IF_ERROR(CheckNoRoundRobin(model));
  const int64_t ws = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != ws - 1) {
    return NotFoundError(job.tag_dir + ": DP ranks are not 0.." + std::to_string(ws - 1) +
                         " (" + ranks.rbegin()->second + ")");
  }
  job.source_dp = ws;
  MoeSource moe;
  for (const auto& [r, name] : ranks) {
    FC_RETURN_IF_ERROR(AddMoeRankFile(sources, rp, r, name, moe));
  }
  const std::vector<SourceFile>& files = moe.files;
  if (!moe.fragment_cls) moe.fragment_cls = PickleGlobal("deepspeed.utils.tensor_fragment", "fragment_address");
  job.variant = moe.bf16 ? "bf16_optimizer" : "zero";
  const size_t ngroups = moe.counts.size();
  const std::vector<int64_t>& counts = moe.counts;
  std::vector<MoeGroup> groups(ngroups);
  for (size_t g = 0; g < ngroups; ++g) {
    const std::string gl = "group " + std::to_string(g);
    MoeGroup& mg = groups[g];
    mg.old_count = counts[g];
    if (mg.old_count <= 0 || ws % mg.old_count != 0) {
      return DataLossError(files[0].path + ": partition_count[" + std::to_string(g) + "] = " +
                           std::to_string(mg.old_count) + " does not divide the " +
                           std::to_string(ws) + " DP ranks");
    }
    mg.ep = ws / mg.old_count;
    if (dp % mg.ep != 0) {
      return InvalidArgumentError("--dp " + std::to_string(dp) + ": param " + gl + " is an "
                                  "expert group over " + std::to_string(mg.ep) +
                                  " expert-parallel ranks; the new DP size must be a multiple "
                                  "of " + std::to_string(mg.ep));
    }
    mg.new_count = dp / mg.ep;
    mg.per_ep.resize(static_cast<size_t>(mg.ep));
    for (int64_t e = 0; e < mg.ep; ++e) {
      FC_RETURN_IF_ERROR(AddMoeEpSources(rp, moe, g, e, mg));
    }
  }

  // The new DP ranks' files, from DP rank 0's tree.
  for (int64_t r = 0; r < dp; ++r) {
    FC_RETURN_IF_ERROR(AddMoeNewRankFile(job, r, prefix, moe, groups));
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_writer_internal
