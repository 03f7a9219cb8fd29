// The ZeRO 1/2 and BF16_Optimizer planner of the DeepSpeed writer. Contract:
// src/format/deepspeed/ds_planners.h; the partitioning rule: shared/reference/deepspeed.md 3.1.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_build.h"
#include "fc/core/checked_math.h"
#include "fc/io/file.h"
#include "src/format/deepspeed/ds_archive_builder.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_planners.h"
#include "src/format/deepspeed/ds_source_file.h"
#include "src/format/deepspeed/ds_tree_edit.h"
#include "src/format/deepspeed/ds_zero12_files.h"
#include "src/format/deepspeed/names.h"

namespace fc::deepspeed_writer_internal {
namespace {

using deepspeed_internal::MpName;

// One model-parallel rank's stage 1/2 source: its param groups (param_shapes of the model
// states) with the plan sources of the old ranks' partitions, and its DP rank files.
struct Zero12Source {
  std::vector<GroupSource> groups;
  std::vector<SourceFile> files;
  PV::Ptr fragment_cls;
  bool bf16 = false;
  bool count_list = false;  // partition_count saved as a list (one per group): kept a list
};

// DP rank r's optimizer file `name` of model-parallel rank m: checked against the groups and
// the source DP size, its partitions added to z12.groups as plan sources, the file to z12.files.
Status AddZero12RankSources(const SourceFiles& sources, Repartitioner& rp, int64_t m,
                            const std::string& model_name, int64_t source_dp, int64_t r,
                            const std::string& name, Zero12Source& z12) {
  std::vector<GroupSource>& groups = z12.groups;
  std::vector<SourceFile>& files = z12.files;
  PV::Ptr& fragment_cls = z12.fragment_cls;
  bool& bf16 = z12.bf16;
  bool& count_list = z12.count_list;
  FC_ASSIGN_OR_RETURN(SourceFile sf, sources.Open(name));
  rp.AddFile(sf);
  const PV* osd = sf.root.Find("optimizer_state_dict");
  if (osd == nullptr || !osd->is_dict()) {
    return DataLossError(sf.path + ": no optimizer_state_dict dict");
  }
  if (osd->Find("fp32_flat_groups")) {
    return UnimplementedError(sf.path + ": ZeRO stage 3 (fp32_flat_groups): "
                              "--output-format deepspeed re-partitions stage 1/2 and "
                              "BF16_Optimizer checkpoints");
  }
  // partition_count: DeepSpeed 0.19's ZeRO 1/2 and BF16_Optimizer save a list, one count
  // per param group (zero_to_fp32 takes its max); older saves an int. A list whose every
  // count is the DP size is a dense checkpoint; other counts are MoE expert groups.
  const PV* pc = osd->Find("partition_count");
  const bool pc_list = pc != nullptr && (pc->is_list() || pc->is_tuple());
  if (pc_list) {
    bool dense = pc->items.size() == groups.size();
    for (const PV::Ptr& i : pc->items) {
      dense = dense && i->is_int() && i->int_value == source_dp;
    }
    if (!dense) {
      return UnimplementedError(sf.path + ": partition_count " + pc->DebugString(60) +
                                " is not " + std::to_string(source_dp) + " for each of the " +
                                std::to_string(groups.size()) + " param groups (MoE expert "
                                "groups with their own DP size): not re-partitioned");
    }
  } else if (pc == nullptr || !pc->is_int() || pc->int_value != source_dp) {
    return DataLossError(sf.path + ": partition_count " +
                         (pc ? pc->DebugString(40) : std::string("missing")) + " but " +
                         std::to_string(source_dp) + " DP rank files for " + MpName(m));
  }
  if (r == 0) count_list = pc_list;
  if (pc_list != count_list) {
    return DataLossError(sf.path + ": partition_count is a list in some DP ranks' files only");
  }
  FC_ASSIGN_OR_RETURN(const PV* base, BaseOptimizerState(sf, *osd, r, &bf16));
  const PV* single = osd->Find("single_partition_of_fp32_groups");
  const PV* state = base->Find("state");
  const PV* paddings = osd->Find("group_paddings");
  if (single == nullptr || !single->is_list() || single->items.size() != groups.size()) {
    return DataLossError(sf.path + ": single_partition_of_fp32_groups is not a list of " +
                         std::to_string(groups.size()) + " (param_shapes groups of " +
                         model_name + ")");
  }
  if (state == nullptr || !state->is_dict() || state->entries.size() != groups.size()) {
    return DataLossError(sf.path + ": base_optimizer_state.state does not hold " +
                         std::to_string(groups.size()) + " groups");
  }
  if (paddings == nullptr || !paddings->is_list() ||
      paddings->items.size() != groups.size()) {
    return DataLossError(sf.path + ": group_paddings is not a list of " +
                         std::to_string(groups.size()));
  }
  if (const PV* maps = osd->Find("param_slice_mappings"); maps && !fragment_cls) {
    for (const PV::Ptr& gm : maps->items) {
      for (const auto& [k, v] : gm->entries) {
        if (v->kind == K::kObject && v->callee) fragment_cls = v->callee;
      }
    }
  }
  for (const auto& [k, st] : state->entries) {
    if (!k->is_int() || k->int_value < 0 ||
        k->int_value >= static_cast<int64_t>(groups.size()) || !st->is_dict()) {
      return DataLossError(sf.path + ": base_optimizer_state.state key " +
                           k->DebugString(20) + " is not a group index");
    }
    const int64_t g = k->int_value;
    if (groups[g].fp32.size() != static_cast<size_t>(r)) {
      return DataLossError(sf.path + ": base_optimizer_state.state holds group " +
                           std::to_string(g) + " twice");
    }
    GroupSource& gs = groups[g];
    const int64_t ps = PaddedLength(gs.orig, source_dp) / source_dp;
    const int64_t lean = LeanLength(gs.orig, ps, r);
    const std::string where = "group " + std::to_string(g);
    const PV* pad = paddings->items[g].get();
    if (!pad->is_int() || pad->int_value != ps - lean) {
      return DataLossError(sf.path + ": group_paddings[" + std::to_string(g) + "] is " +
                           pad->DebugString(20) + ", the padding rule gives " +
                           std::to_string(ps - lean) + " (" + std::to_string(gs.orig) +
                           " elements over " + std::to_string(source_dp) + " ranks)");
    }
    FC_RETURN_IF_ERROR(AddPartitionSources(
        rp, sf, *single->items[g], *st, g, ps, lean, bf16, r == 0,
        MpName(m) + ".rank" + std::to_string(r) + ".group" + std::to_string(g) + ".", &gs));
  }
  files.push_back(std::move(sf));
  return Status::Ok();
}

// New DP rank r's optimizer file of model-parallel rank m, from DP rank 0's tree.
Status AddZero12RankFile(DsRepartition& job, const Repartitioner& rp, int64_t m, int64_t r,
                         const std::string& prefix, const Zero12Source& z12) {
  const int64_t dp = job.dp;
  const std::vector<GroupSource>& groups = z12.groups;
  const PV::Ptr& fragment_cls = z12.fragment_cls;
  const bool bf16 = z12.bf16;
  const bool count_list = z12.count_list;
  const SourceFile& rank0 = z12.files.front();
  const std::string name = prefix + "zero_pp_rank_" + std::to_string(r) + "_" + MpName(m) +
                           "_optim_states.pt";
  ArchiveBuilder out(JoinPath(job.tag, name));
  PV singles, paddings, mappings;
  singles.kind = paddings.kind = mappings.kind = K::kList;
  std::vector<PV::Ptr> ea(groups.size()), eas(groups.size());
  const std::string label = MpName(m) + " rank " + std::to_string(r) + " group ";
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupSource& gs = groups[g];
    const int64_t ps = PaddedLength(gs.orig, dp) / dp;
    const int64_t lean = LeanLength(gs.orig, ps, r);
    const std::string gl = label + std::to_string(g);
    singles.items.push_back(out.NewTensor(
        rp.Partition(gs, gs.fp32, gs.dtype, r, gl + " fp32"), bf16 ? ps : lean,
        gs.storage_class));
    ea[g] = out.NewTensor(rp.Partition(gs, gs.exp_avg, gs.state_dtype, r, gl + " exp_avg"),
                          ps, gs.state_storage_class);
    eas[g] = out.NewTensor(
        rp.Partition(gs, gs.exp_avg_sq, gs.state_dtype, r, gl + " exp_avg_sq"), ps,
        gs.state_storage_class);
    paddings.items.push_back(PickleInt(ps - lean));
    mappings.items.push_back(SliceMappings(gs, ps, r, fragment_cls));
  }
  PV::Ptr counts = PickleInt(dp);
  if (count_list) {
    PV list;
    list.kind = K::kList;
    for (size_t g = 0; g < groups.size(); ++g) list.items.push_back(PickleInt(dp));
    counts = Node(std::move(list));
  }
  FC_RETURN_IF_ERROR(AddOptimStates(job, std::move(out), rank0, Node(std::move(singles)),
                                    Node(std::move(paddings)), std::move(counts),
                                    Node(std::move(mappings)), ea, eas));
  return Status::Ok();
}

}  // namespace

Status PlanZero12(DsRepartition& job, const SourceFiles& sources, Repartitioner& rp, int64_t m,
                  const std::string& model_name,
                  const std::map<int64_t, std::string>* optim_ranks,
                  const std::string& prefix) {
  const int64_t dp = job.dp;
  FC_ASSIGN_OR_RETURN(SourceFile model, sources.Open(model_name));
  rp.AddFile(model);
  if (!model.root.is_dict()) return DataLossError(model.path + ": not a dict");
  const PV* dpws = model.root.Find("dp_world_size");
  if (optim_ranks == nullptr) {
    job.source_dp = dpws && dpws->is_int() ? dpws->int_value : 0;
  }
  if (model.root.Find("ds_autoep_layers") || model.root.Find("autoep_layers")) {
    return UnimplementedError(model.path + ": AutoEP (MoE) checkpoint: not re-partitioned");
  }
  FC_RETURN_IF_ERROR(AddModelStates(job, model_name, model));
  if (optim_ranks == nullptr) return Status::Ok();
  FC_RETURN_IF_ERROR(CheckNoRoundRobin(model));
  // The groups: param_shapes of the model states.
  const PV* shapes = model.root.Find("param_shapes");
  if (shapes == nullptr || !shapes->is_list()) {
    return DataLossError(model.path + ": no param_shapes list (needed to lay out the flat "
                         "partitions)");
  }
  Zero12Source z12;
  std::vector<GroupSource>& groups = z12.groups;
  groups.resize(shapes->items.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [k, v] : shapes->items[g]->entries) {
      if (!k->is_str()) return DataLossError(model.path + ": param_shapes key not a string");
      FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model.path + ": param_shapes['" + k->str + "']"));
      groups[g].params.emplace_back(k->str, n);
      auto sum = CheckedAdd(groups[g].orig, n);
      if (!sum) return OutOfRangeError(model.path + ": param_shapes group size overflows");
      groups[g].orig = *sum;
    }
  }

  // The source DP ranks.
  const std::map<int64_t, std::string>& ranks = *optim_ranks;
  const int64_t source_dp = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != source_dp - 1) {
    return NotFoundError(job.tag_dir + ": DP ranks of " + MpName(m) + " are not 0.." +
                         std::to_string(source_dp - 1) + " (" + ranks.rbegin()->second + ")");
  }
  if (job.source_dp != 0 && job.source_dp != source_dp) {
    return DataLossError(job.tag_dir + ": " + MpName(m) + " has " + std::to_string(source_dp) +
                         " DP ranks, " + MpName(0) + " " + std::to_string(job.source_dp));
  }
  job.source_dp = source_dp;
  for (const auto& [r, name] : ranks) {
    FC_RETURN_IF_ERROR(AddZero12RankSources(sources, rp, m, model_name, source_dp, r, name, z12));
  }
  job.variant = z12.bf16 ? "bf16_optimizer" : "zero";
  if (!z12.fragment_cls) z12.fragment_cls = PickleGlobal("deepspeed.utils.tensor_fragment", "fragment_address");

  // The new DP ranks' files, from DP rank 0's tree.
  for (int64_t r = 0; r < dp; ++r) {
    FC_RETURN_IF_ERROR(AddZero12RankFile(job, rp, m, r, prefix, z12));
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_writer_internal
