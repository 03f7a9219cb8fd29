// The ZeRO-3 planner of the DeepSpeed writer. Contract: src/format/deepspeed/ds_planners.h;
// the layout: shared/reference/deepspeed.md 4.1.
#include <algorithm>
#include <array>
#include <utility>

#include "fc/codec/pickle_build.h"
#include "fc/io/file.h"
#include "src/format/deepspeed/ds_archive_builder.h"
#include "src/format/deepspeed/ds_partition.h"
#include "src/format/deepspeed/ds_planners.h"
#include "src/format/deepspeed/ds_source_file.h"
#include "src/format/deepspeed/ds_tree_edit.h"
#include "src/format/deepspeed/names.h"

namespace fc::deepspeed_writer_internal {
namespace {

using deepspeed_internal::MpName;

// Refuses a re-partition after which DeepSpeed would group the params into other
// sub-groups: when the config's sub_group_size (default 1e9) gives the source's split at the
// source DP size but another one at the new size. A source the rule does not reproduce (or
// without the facts to check) keeps its split.
Status CheckSubGroups(const std::vector<std::vector<Zero3Param>>& groups, const PV& model,
                      const PV& optim, int64_t old_dp, int64_t dp, const std::string& where) {
  double size = 1e9;
  if (const PV* cfg = model.Find("ds_config"); cfg && cfg->is_dict()) {
    if (const PV* z = cfg->Find("zero_optimization"); z && z->is_dict()) {
      if (const PV* v = z->Find("sub_group_size")) {
        if (v->is_int()) size = static_cast<double>(v->int_value);
        if (v->kind == K::kFloat) size = v->float_value;
      }
    }
  }
  const PV* osd = optim.Find("optimizer_state_dict");
  const PV* inner = osd ? osd->Find("optimizer_state_dict") : nullptr;
  const PV* pgs = inner ? inner->Find("param_groups") : nullptr;
  if (pgs == nullptr || !pgs->is_list()) return Status::Ok();
  for (size_t j = 0; j < pgs->items.size(); ++j) {
    const PV* ids = pgs->items[j]->Find("params");
    if (ids == nullptr || !ids->is_list()) return Status::Ok();
    std::vector<int64_t> numels;
    std::vector<size_t> split;
    for (const PV::Ptr& id : ids->items) {
      if (!id->is_int() || id->int_value < 0 ||
          id->int_value >= static_cast<int64_t>(groups.size())) {
        return Status::Ok();
      }
      const std::vector<Zero3Param>& g = groups[static_cast<size_t>(id->int_value)];
      split.push_back(g.size());
      for (const Zero3Param& p : g) numels.push_back(p.numel);
    }
    if (numels.empty()) continue;
    const std::vector<size_t> at_old = SubGroupSplit(numels, old_dp, size);
    const std::vector<size_t> at_new = SubGroupSplit(numels, dp, size);
    if (at_old == split && at_new != at_old) {
      return UnimplementedError(
          where + ": param group " + std::to_string(j) + ": sub_group_size " +
          std::to_string(static_cast<int64_t>(size)) + " splits its params into " +
          std::to_string(at_old.size()) + " sub-group(s) at dp " + std::to_string(old_dp) +
          " but " + std::to_string(at_new.size()) + " at dp " + std::to_string(dp) +
          ", with other boundaries: DeepSpeed would regroup them; fc keeps the source's "
          "sub-groups and does not regroup");
    }
  }
  return Status::Ok();
}

static constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};

// One model-parallel rank's ZeRO-3 source: its DP rank files, the sub-groups and frozen
// params of model states rank 0, and the plan sources of the old ranks' slices.
struct Zero3Source {
  int64_t old_dp = 0;
  std::vector<SourceFile> mfiles, ofiles;
  std::vector<std::vector<Zero3Param>> groups;
  std::vector<Zero3Param> frozen;
  // Frozen fragments: per param, per old rank, the located fragment.
  std::vector<std::vector<int64_t>> frozen_src;
  std::vector<PV::Ptr> frozen_cls;
  std::vector<DType> frozen_dtype;
  // Optimizer partitions: per sub-group, per state (fp32, exp_avg, exp_avg_sq), per old rank.
  std::vector<std::array<std::vector<int64_t>, 3>> src;
  std::vector<std::array<PV::Ptr, 3>> cls;
  std::vector<std::array<DType, 3>> dtypes;
};

// Checks the DP rank files of model-parallel rank m and opens them into z3.mfiles / z3.ofiles.
Status OpenZero3Files(DsRepartition& job, const SourceFiles& sources, Repartitioner& rp, int64_t m,
                      const std::map<int64_t, std::string>& models,
                      const std::map<int64_t, std::map<int64_t, std::string>>& optim,
                      Zero3Source& z3) {
  auto oit = optim.find(m);
  if (oit == optim.end() || oit->second.size() != models.size()) {
    return NotFoundError(job.tag_dir + ": " + MpName(m) + ": " + std::to_string(models.size()) +
                         " ZeRO-3 model-states files but " +
                         std::to_string(oit == optim.end() ? 0 : oit->second.size()) +
                         " optimizer files");
  }
  const int64_t old_dp = static_cast<int64_t>(models.size());
  if (models.rbegin()->first != old_dp - 1 || oit->second.rbegin()->first != old_dp - 1) {
    return NotFoundError(job.tag_dir + ": DP ranks of " + MpName(m) + " are not 0.." +
                         std::to_string(old_dp - 1));
  }
  if (job.source_dp != 0 && job.source_dp != old_dp) {
    return DataLossError(job.tag_dir + ": " + MpName(m) + " has " + std::to_string(old_dp) +
                         " DP ranks, " + MpName(0) + " " + std::to_string(job.source_dp));
  }
  job.source_dp = old_dp;
  z3.old_dp = old_dp;
  std::vector<SourceFile>& mfiles = z3.mfiles;
  std::vector<SourceFile>& ofiles = z3.ofiles;
  for (const auto& [r, name] : models) {
    FC_ASSIGN_OR_RETURN(SourceFile sf, sources.Open(name));
    rp.AddFile(sf);
    if (!sf.root.is_dict()) return DataLossError(sf.path + ": not a dict");
    mfiles.push_back(std::move(sf));
  }
  for (const auto& [r, name] : oit->second) {
    FC_ASSIGN_OR_RETURN(SourceFile sf, sources.Open(name));
    rp.AddFile(sf);
    ofiles.push_back(std::move(sf));
  }
  return Status::Ok();
}

// Sub-groups (param_shapes order) and frozen params.
Status ReadZero3Shapes(const SourceFile& model0, Zero3Source& z3) {
  std::vector<std::vector<Zero3Param>>& groups = z3.groups;
  std::vector<Zero3Param>& frozen = z3.frozen;
  const PV* shapes = model0.root.Find("param_shapes");
  if (shapes == nullptr || !shapes->is_list()) {
    return DataLossError(model0.path + ": no param_shapes list");
  }
  groups.resize(shapes->items.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    for (const auto& [key, v] : shapes->items[k]->entries) {
      if (!key->is_str()) return DataLossError(model0.path + ": param_shapes key not a string");
      FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model0.path + ": param_shapes['" + key->str + "']"));
      groups[k].push_back({key->str, n});
    }
  }
  if (const PV* fs = model0.root.Find("frozen_param_shapes"); fs && !fs->is_none()) {
    for (const auto& [key, v] : fs->entries) {
      if (!key->is_str()) {
        return DataLossError(model0.path + ": frozen_param_shapes key not a string");
      }
      FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model0.path + ": frozen_param_shapes['" + key->str + "']"));
      frozen.push_back({key->str, n});
    }
  }
  return Status::Ok();
}

// Frozen fragments: per param, per old rank, the located fragment.
Status LocateFrozenFragments(Repartitioner& rp, int64_t m, Zero3Source& z3) {
  const int64_t old_dp = z3.old_dp;
  const std::vector<SourceFile>& mfiles = z3.mfiles;
  const std::vector<Zero3Param>& frozen = z3.frozen;
  std::vector<std::vector<int64_t>>& frozen_src = z3.frozen_src;
  std::vector<PV::Ptr>& frozen_cls = z3.frozen_cls;
  std::vector<DType>& frozen_dtype = z3.frozen_dtype;
  frozen_src.resize(frozen.size());
  frozen_cls.resize(frozen.size());
  frozen_dtype.resize(frozen.size());
  for (int64_t o = 0; o < old_dp; ++o) {
    const SourceFile& sf = mfiles[o];
    const PV* frags = sf.root.Find("frozen_param_fragments");
    for (size_t i = 0; i < frozen.size(); ++i) {
      const std::string what = "frozen_param_fragments['" + frozen[i].name + "']";
      const PV* t = frags ? frags->Find(frozen[i].name) : nullptr;
      FC_ASSIGN_OR_RETURN(Located l, LocateTensor(sf, t, what));
      const int64_t ps = CeilDiv(frozen[i].numel, old_dp);
      if (l.ref.shape[0] != ps) {
        return DataLossError(sf.path + ": " + what + " has " + std::to_string(l.ref.shape[0]) +
                             " elements, ceil(" + std::to_string(frozen[i].numel) + " / " +
                             std::to_string(old_dp) + ") is " + std::to_string(ps));
      }
      if (o == 0) {
        frozen_dtype[i] = l.ref.dtype;
        FC_ASSIGN_OR_RETURN(frozen_cls[i], StorageClassOf(*t, sf.path + ": " + what));
      } else if (l.ref.dtype != frozen_dtype[i]) {
        return DataLossError(sf.path + ": " + what + " dtype differs by rank");
      }
      frozen_src[i].push_back(rp.AddSource(MpName(m) + ".rank" + std::to_string(o) + ".frozen." +
                                               frozen[i].name, sf, l, ps));
    }
  }
  return Status::Ok();
}

// Optimizer partitions: per sub-group, per state (fp32, exp_avg, exp_avg_sq), per old rank.
Status LocateZero3Partitions(Repartitioner& rp, int64_t m, Zero3Source& z3) {
  const int64_t old_dp = z3.old_dp;
  const std::vector<SourceFile>& ofiles = z3.ofiles;
  const std::vector<std::vector<Zero3Param>>& groups = z3.groups;
  const size_t K = groups.size();
  std::vector<std::array<std::vector<int64_t>, 3>>& src = z3.src;
  std::vector<std::array<PV::Ptr, 3>>& cls = z3.cls;
  std::vector<std::array<DType, 3>>& dtypes = z3.dtypes;
  src.resize(K);
  cls.resize(K);
  dtypes.resize(K);
  for (int64_t o = 0; o < old_dp; ++o) {
    const SourceFile& sf = ofiles[o];
    const PV* osd = sf.root.Find("optimizer_state_dict");
    if (osd == nullptr || !osd->is_dict()) return DataLossError(sf.path + ": no optimizer_state_dict");
    const PV* flat = osd->Find("fp32_flat_groups");
    const PV* inner = osd->Find("optimizer_state_dict");
    const PV* state = inner ? inner->Find("state") : nullptr;
    const PV* pc = osd->Find("partition_count");
    if (osd->Find("ds_zero_partition_groups")) {
      return UnimplementedError(sf.path + ": AutoEP ZeRO-3 partition groups: not re-partitioned");
    }
    if (pc == nullptr || !pc->is_int() || pc->int_value != old_dp) {
      return DataLossError(sf.path + ": partition_count " + (pc ? pc->DebugString(40) : std::string("missing")) +
                           " but " + std::to_string(old_dp) + " DP rank files for " + MpName(m));
    }
    if (flat == nullptr || !flat->is_list() || flat->items.size() != K) {
      return DataLossError(sf.path + ": fp32_flat_groups is not a list of " + std::to_string(K) +
                           " (param_shapes sub-groups)");
    }
    if (state == nullptr || !state->is_dict() || state->entries.size() != K) {
      return DataLossError(sf.path + ": optimizer_state_dict.state does not hold " +
                           std::to_string(K) + " sub-groups");
    }
    for (const auto& [key, st] : state->entries) {
      if (!key->is_int() || key->int_value < 0 || key->int_value >= static_cast<int64_t>(K) ||
          !st->is_dict()) {
        return DataLossError(sf.path + ": optimizer_state_dict.state key " + key->DebugString(20) +
                             " is not a sub-group index");
      }
      const size_t k = static_cast<size_t>(key->int_value);
      if (src[k][0].size() != static_cast<size_t>(o)) {
        return DataLossError(sf.path + ": optimizer_state_dict.state holds sub-group " +
                             std::to_string(k) + " twice");
      }
      int64_t length = 0;
      for (const Zero3Param& p : groups[k]) length += CeilDiv(p.numel, old_dp);
      const PV* values[3] = {flat->items[k].get(), st->Find("exp_avg"), st->Find("exp_avg_sq")};
      for (int s = 0; s < 3; ++s) {
        const std::string what = s == 0 ? "fp32_flat_groups[" + std::to_string(k) + "]"
                                        : "optimizer_state_dict.state[" + std::to_string(k) +
                                              "]." + kStates[s];
        FC_ASSIGN_OR_RETURN(Located l, LocateTensor(sf, values[s], what));
        if (l.ref.shape[0] != length) {
          return DataLossError(sf.path + ": " + what + " has " + std::to_string(l.ref.shape[0]) +
                               " elements, its params' slices " + std::to_string(length));
        }
        if (o == 0) {
          dtypes[k][s] = l.ref.dtype;
          FC_ASSIGN_OR_RETURN(cls[k][s], StorageClassOf(*values[s], sf.path + ": " + what));
        } else if (l.ref.dtype != dtypes[k][s]) {
          return DataLossError(sf.path + ": " + what + " dtype differs by rank");
        }
        src[k][s].push_back(rp.AddSource(MpName(m) + ".rank" + std::to_string(o) + ".subgroup" +
                                             std::to_string(k) + "." + kStates[s], sf, l, length));
      }
    }
  }
  return Status::Ok();
}

// New DP rank r's files of model-parallel rank m, from DP rank 0's trees.
Status AddZero3RankFiles(DsRepartition& job, const Zero3Source& z3, int64_t m, int64_t r,
                         const std::string& model_prefix, const std::string& prefix) {
  const int64_t dp = job.dp;
  const int64_t old_dp = z3.old_dp;
  const SourceFile& model0 = z3.mfiles.front();
  const std::vector<SourceFile>& ofiles = z3.ofiles;
  const std::vector<std::vector<Zero3Param>>& groups = z3.groups;
  const std::vector<Zero3Param>& frozen = z3.frozen;
  const size_t K = groups.size();
  const auto& frozen_src = z3.frozen_src;
  const auto& frozen_cls = z3.frozen_cls;
  const auto& frozen_dtype = z3.frozen_dtype;
  const auto& src = z3.src;
  const auto& cls = z3.cls;
  const auto& dtypes = z3.dtypes;
  const std::string rank = "zero_pp_rank_" + std::to_string(r) + "_" + MpName(m);
  const std::string label = MpName(m) + " rank " + std::to_string(r);
  // Model states: dp_world_size, frozen_param_fragments.
  ArchiveBuilder mout(JoinPath(job.tag, model_prefix + rank + "_model_states.pt"));
  PV frags;
  bool has_frags = false;
  if (const PV* f0 = model0.root.Find("frozen_param_fragments"); f0 && !f0->is_none()) {
    frags = *f0;
    has_frags = true;
    frags.entries.clear();
    for (size_t i = 0; i < frozen.size(); ++i) {
      const int64_t ps = CeilDiv(frozen[i].numel, dp);
      DsRecord rec = StreamRecord(frozen_dtype[i], ps, label + " frozen " + frozen[i].name);
      std::vector<int64_t> zeros(static_cast<size_t>(old_dp), 0);
      AddZero3Parts(rec, frozen[i].numel, old_dp, dp, r, frozen_src[i], zeros, 0);
      frags.entries.emplace_back(PickleStr(frozen[i].name),
                                 mout.NewTensor(std::move(rec), ps, frozen_cls[i]));
    }
  }
  PV::Ptr mroot = ReplaceEntries(model0.root, [&](const std::string& k, const PV::Ptr&) -> PV::Ptr {
    if (k == "dp_world_size") return PickleInt(dp);
    if (k == "frozen_param_fragments" && has_frags) return Node(frags);
    return nullptr;
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec mspec, mout.Finish(*mroot, model0));
  job.archives.push_back(std::move(mspec));
  // Optimizer states: partition_count, fp32_flat_groups, exp_avg, exp_avg_sq.
  ArchiveBuilder out(JoinPath(job.tag, prefix + rank + "_optim_states.pt"));
  std::vector<std::array<PV::Ptr, 3>> made(K);
  for (size_t k = 0; k < K; ++k) {
    std::vector<int64_t> old_at(static_cast<size_t>(old_dp), 0);
    int64_t length = 0;
    for (const Zero3Param& p : groups[k]) length += CeilDiv(p.numel, dp);
    for (int s = 0; s < 3; ++s) {
      DsRecord rec = StreamRecord(dtypes[k][s], length,
                                  label + " sub-group " + std::to_string(k) + " " + kStates[s]);
      int64_t dst_at = 0;
      std::fill(old_at.begin(), old_at.end(), 0);
      for (const Zero3Param& p : groups[k]) {
        AddZero3Parts(rec, p.numel, old_dp, dp, r, src[k][s], old_at, dst_at);
        dst_at += CeilDiv(p.numel, dp);
        for (int64_t& a : old_at) a += CeilDiv(p.numel, old_dp);
      }
      made[k][s] = out.NewTensor(std::move(rec), length, cls[k][s]);
    }
  }
  const SourceFile& opt0 = ofiles.front();
  const PV* osd0 = opt0.root.Find("optimizer_state_dict");
  PV::Ptr new_osd = ReplaceEntries(*osd0, [&](const std::string& k, const PV::Ptr& v) -> PV::Ptr {
    if (k == "partition_count") return PickleInt(dp);
    if (k == "fp32_flat_groups") {
      PV list = *v;
      for (size_t g = 0; g < K; ++g) list.items[g] = made[g][0];
      return Node(std::move(list));
    }
    if (k != "optimizer_state_dict") return nullptr;
    return ReplaceEntries(*v, [&](const std::string& ik, const PV::Ptr& iv) -> PV::Ptr {
      if (ik != "state") return nullptr;
      return WithMoments(*iv, made.size(), [&](size_t g, bool sq) { return made[g][sq ? 2 : 1]; });
    });
  });
  PV::Ptr root = ReplaceEntries(opt0.root, [&](const std::string& k, const PV::Ptr&) {
    return k == "optimizer_state_dict" ? new_osd : PV::Ptr();
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec spec, out.Finish(*root, opt0));
  job.archives.push_back(std::move(spec));
  return Status::Ok();
}

}  // namespace

Status PlanZero3(DsRepartition& job, const SourceFiles& sources,
                 const std::map<int64_t, std::map<int64_t, std::string>>& model3,
                 const std::map<int64_t, std::map<int64_t, std::string>>& optim,
                 const std::string& model_prefix, const std::string& prefix) {
  job.variant = "zero3";
  job.mp = static_cast<int64_t>(model3.size());
  if (model3.rbegin()->first != job.mp - 1) {
    return NotFoundError(job.tag_dir + ": model-parallel ranks are not 0.." +
                         std::to_string(job.mp - 1));
  }
  Repartitioner rp(job);
  const int64_t dp = job.dp;
  for (const auto& [m, models] : model3) {
    Zero3Source z3;
    FC_RETURN_IF_ERROR(OpenZero3Files(job, sources, rp, m, models, optim, z3));
    const SourceFile& model0 = z3.mfiles.front();
    FC_RETURN_IF_ERROR(ReadZero3Shapes(model0, z3));
    FC_RETURN_IF_ERROR(CheckSubGroups(z3.groups, model0.root, z3.ofiles.front().root, z3.old_dp, dp,
                                      z3.ofiles.front().path));
    FC_RETURN_IF_ERROR(LocateFrozenFragments(rp, m, z3));
    FC_RETURN_IF_ERROR(LocateZero3Partitions(rp, m, z3));
    // The new ranks' files, from DP rank 0's trees.
    for (int64_t r = 0; r < dp; ++r) {
      FC_RETURN_IF_ERROR(AddZero3RankFiles(job, z3, m, r, model_prefix, prefix));
    }
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_writer_internal
