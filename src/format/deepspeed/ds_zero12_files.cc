// The shared ZeRO 1/2 pieces of the DeepSpeed writer. Contract:
// src/format/deepspeed/ds_zero12_files.h.
#include "src/format/deepspeed/ds_zero12_files.h"

#include <utility>

#include "fc/codec/pickle_build.h"
#include "fc/io/file.h"

namespace fc::deepspeed_writer_internal {

Status AddModelStates(DsRepartition& job, const std::string& model_name,
                      const SourceFile& model) {
  ArchiveBuilder model_out(JoinPath(job.tag, model_name));
  PV::Ptr model_root = ReplaceEntries(model.root, [&](const std::string& k, const PV::Ptr&) {
    return k == "dp_world_size" ? PickleInt(job.dp) : PV::Ptr();
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec model_spec, model_out.Finish(*model_root, model));
  job.archives.push_back(std::move(model_spec));
  return Status::Ok();
}

Status CheckNoRoundRobin(const SourceFile& model) {
  // (MoE model states carry no ds_config; the optimizer files' copy is checked too.)
  if (const PV* cfg = model.root.Find("ds_config"); cfg && cfg->is_dict()) {
    const PV* z = cfg->Find("zero_optimization");
    const PV* rr = z && z->is_dict() ? z->Find("round_robin_gradients") : nullptr;
    if (rr && rr->kind == K::kBool && rr->bool_value) {
      return UnimplementedError(model.path + ": ds_config round_robin_gradients: the flat "
                                "buffers' param order depends on the DP size; not "
                                "re-partitioned");
    }
  }
  return Status::Ok();
}

Status AddOptimStates(DsRepartition& job, ArchiveBuilder out, const SourceFile& rank0,
                      PV::Ptr singles, PV::Ptr paddings, PV::Ptr partition_count,
                      PV::Ptr mappings, const std::vector<PV::Ptr>& ea,
                      const std::vector<PV::Ptr>& eas) {
  const PV* osd0 = rank0.root.Find("optimizer_state_dict");
  PV::Ptr new_osd = ReplaceEntries(*osd0, [&](const std::string& k, const PV::Ptr& v) -> PV::Ptr {
    if (k == "single_partition_of_fp32_groups") return singles;
    if (k == "group_paddings") return paddings;
    if (k == "partition_count") return partition_count;
    if (k == "param_slice_mappings") return mappings;
    if (k != "base_optimizer_state") return nullptr;
    return ReplaceEntries(*v, [&](const std::string& bk, const PV::Ptr& bv) -> PV::Ptr {
      if (bk != "state") return nullptr;
      return WithMoments(*bv, ea.size(), [&](size_t g, bool sq) { return sq ? eas[g] : ea[g]; });
    });
  });
  PV::Ptr root = ReplaceEntries(rank0.root, [&](const std::string& k, const PV::Ptr&) {
    return k == "optimizer_state_dict" ? new_osd : PV::Ptr();
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec spec, out.Finish(*root, rank0));
  job.archives.push_back(std::move(spec));
  return Status::Ok();
}

Status AddPartitionSources(Repartitioner& rp, const SourceFile& sf, const PV& single,
                           const PV& state, size_t g, int64_t ps, int64_t lean, bool bf16,
                           bool first, const std::string& key, GroupSource* gs) {
  const std::string where = "group " + std::to_string(g);
  FC_ASSIGN_OR_RETURN(Located fp32, LocateTensor(sf, &single, "single_partition_of_fp32_groups[" +
                                                                  std::to_string(g) + "]"));
  const int64_t want = bf16 ? ps : lean;
  if (fp32.ref.shape[0] != want) {
    return DataLossError(sf.path + ": single_partition_of_fp32_groups[" + std::to_string(g) +
                         "] has " + std::to_string(fp32.ref.shape[0]) +
                         " elements, the partition rule gives " + std::to_string(want) +
                         (bf16 ? " (BF16_Optimizer: padded)" : " (padding stripped)"));
  }
  if (first) {
    gs->dtype = fp32.ref.dtype;
    FC_ASSIGN_OR_RETURN(gs->storage_class, StorageClassOf(single, sf.path + ": " + where));
  }
  if (fp32.ref.dtype != gs->dtype) {
    return DataLossError(sf.path + ": " + where + " fp32 partition dtype differs by rank");
  }
  gs->fp32.push_back(rp.AddSource(key + "fp32", sf, fp32, lean));
  for (const char* s : {"exp_avg", "exp_avg_sq"}) {
    FC_ASSIGN_OR_RETURN(Located t, LocateTensor(sf, state.Find(s),
                                               "base_optimizer_state.state[" +
                                                   std::to_string(g) + "]." + s));
    if (t.ref.shape[0] != ps) {
      return DataLossError(sf.path + ": base_optimizer_state.state[" + std::to_string(g) +
                           "]." + s + " has " + std::to_string(t.ref.shape[0]) +
                           " elements, the padded partition " + std::to_string(ps));
    }
    if (first && s == std::string("exp_avg")) {
      gs->state_dtype = t.ref.dtype;
      FC_ASSIGN_OR_RETURN(gs->state_storage_class,
                          StorageClassOf(*state.Find(s), sf.path + ": " + where));
    }
    if (t.ref.dtype != gs->state_dtype) {
      return DataLossError(sf.path + ": " + where + " " + s + " dtype differs by rank");
    }
    (s == std::string("exp_avg") ? gs->exp_avg : gs->exp_avg_sq)
        .push_back(rp.AddSource(key + s, sf, t, lean));
  }
  return Status::Ok();
}

Result<const PV*> BaseOptimizerState(const SourceFile& sf, const PV& optimizer_state,
                                      int64_t r, bool* bf16) {
  const PV* osd = &optimizer_state;
  const bool this_bf16 = osd->Find("zero_stage") == nullptr;
  if (r == 0) *bf16 = this_bf16;
  if (this_bf16 != *bf16) {
    return DataLossError(sf.path + ": zero_stage present in some DP ranks' files only");
  }
  const PV* base = osd->Find("base_optimizer_state");
  if (base == nullptr || !base->is_dict() || osd->Find("base_optimizer_state_step")) {
    return UnimplementedError(sf.path + ": elastic (or missing) base_optimizer_state: "
                              "not re-partitioned");
  }
  return base;
}

}  // namespace fc::deepspeed_writer_internal
