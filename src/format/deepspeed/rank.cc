// One model-parallel rank's files into tensor families: which optimizer (ZeRO 0-3,
// BF16_Optimizer, MoE) wrote them, then its partitions and the module.
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

namespace fc::deepspeed_internal {

namespace {

// A rank's ZeRO-3 model states files in DP rank order. Errors: kNotFound naming the first
// DP rank missing (`dir`: the checkpoint).
Result<std::vector<const PtFile*>> Zero3Models(const RankFiles& rf, const std::string& dir) {
  std::vector<const PtFile*> models;
  for (const auto& [dp, f] : rf.model_z3) {
    if (dp != static_cast<int64_t>(models.size())) {
      return NotFoundError(dir + ": ZeRO-3 model states of DP rank " +
                           std::to_string(models.size()) + " are missing");
    }
    models.push_back(f);
  }
  return models;
}

}  // namespace

Status Reader::ReadRank(int64_t mp, RankFiles& rf) {
  std::vector<const PtFile*> optims;
  for (const auto& [dp, f] : rf.optim) {
    if (dp != static_cast<int64_t>(optims.size())) {
      return NotFoundError(dir_ + ": optimizer file of DP rank " + std::to_string(optims.size()) +
                           " for " + MpName(mp) + " is missing");
    }
    optims.push_back(f);
  }
  std::vector<const PV*> osds;
  for (const PtFile* f : optims) {
    const PV* osd = f->root.Find("optimizer_state_dict");
    if (osd == nullptr || PickleDictEntries(osd) == nullptr) {
      return DataLossError(f->name + ": no optimizer_state_dict dict");
    }
    osds.push_back(osd);
    if (auto v = PickleStr(f->root.Find("ds_version"))) SetAttr("deepspeed.ds_version", *v, f->name);
  }
  std::string variant = "none";
  int64_t stage = 0;
  if (!osds.empty()) {
    const PV* osd = osds[0];
    if (osd->Find("fp32_flat_groups") != nullptr) {
      variant = "zero3";
      stage = 3;
    } else if (const PV* zs = osd->Find("zero_stage")) {
      auto s = IntOf(zs);
      if (!s || *s < 0 || *s > 3) {
        return DataLossError(optims[0]->name + ": zero_stage is " + zs->DebugString());
      }
      variant = "zero";
      stage = *s;
    } else if (osd->Find("single_partition_of_fp32_groups") != nullptr) {
      variant = "bf16_optimizer";
      stage = 1;
    } else {
      return UnimplementedError(optims[0]->name + ": optimizer_state_dict is neither ZeRO "
                                "(zero_stage / fp32_flat_groups) nor BF16_Optimizer");
    }
    if (moe_) {
      if (variant == "zero3") {
        // ZeRO-3 with MoE: not known how its expert groups lie in the files; the module and
        // expert weights are read, the optimizer files are not.
        SetAttr("deepspeed.optimizer", "not read (MoE)", optims[0]->name);
        SetAttr("deepspeed.zero_stage", "not read (MoE)", optims[0]->name);
        if (rf.model == nullptr) {
          return UnimplementedError(optims[0]->name + ": MoE checkpoint with a " + variant +
                                    " optimizer and no mp_rank_XX_model_states.pt: not read");
        }
        return AddModule(*rf.model, false);
      }
      if (rf.model == nullptr) {
        return NotFoundError(dir_ + ": mp_rank_00_model_states.pt is missing");
      }
      SetAttr("deepspeed.zero_stage", std::to_string(stage), optims[0]->name);
      SetAttr("deepspeed.optimizer", variant, optims[0]->name);
      SetAttr("deepspeed.dp_degree", std::to_string(optims.size()), optims[0]->name);
      FC_RETURN_IF_ERROR(ReadMoeZero12(optims, osds, variant == "bf16_optimizer"));
      return AddModule(*rf.model, false);
    }
    for (size_t r = 0; r < osds.size(); ++r) {
      const PV* pc = osds[r]->Find("partition_count");
      std::optional<int64_t> count = IntOf(pc);
      if (!count && pc != nullptr && PickleListItems(pc) != nullptr) {
        for (const auto& i : *PickleListItems(pc)) {
          auto c = IntOf(i.get());
          if (!c) break;
          if (count && *count != *c) {
            // deepspeed.md gives only that expert groups have their own DP size: not which
            // file holds which partition of such a group, nor the expert params' names
            // across expert-parallel ranks (param_shapes is DP rank 0's). Not guessed.
            return UnimplementedError(
                optims[r]->name + ": partition_count differs per param group (" +
                pc->DebugString() + ": MoE expert groups partitioned over their own DP size); "
                "how such a group's partitions lie in the optimizer files is not known to fc, "
                "so this checkpoint is not read");
          }
          count = c;
        }
      }
      if (!count || *count != static_cast<int64_t>(osds.size())) {
        return DataLossError(optims[r]->name + ": partition_count is " +
                             (pc ? pc->DebugString() : std::string("missing")) + " but there are " +
                             std::to_string(osds.size()) + " optimizer files for this TP rank");
      }
    }
  }
  SetAttr("deepspeed.zero_stage", std::to_string(stage), "mp rank " + std::to_string(mp));
  SetAttr("deepspeed.optimizer", variant, "mp rank " + std::to_string(mp));
  SetAttr("deepspeed.dp_degree", std::to_string(std::max<size_t>(1, optims.size())), "");
  if (variant == "zero3") {
    FC_ASSIGN_OR_RETURN(const std::vector<const PtFile*> models, Zero3Models(rf, dir_));
    if (models.size() != optims.size()) {
      return NotFoundError(dir_ + ": " + std::to_string(models.size()) +
                           " ZeRO-3 model state files for " + std::to_string(optims.size()) +
                           " optimizer files");
    }
    FC_RETURN_IF_ERROR(ReadZero3(models, optims, osds));
    return AddModule(*models[0], /*zero3_placeholders=*/true);
  }
  if (universal_ && rf.model == nullptr && !rf.model_z3.empty()) {
    // A stage-3 UCP keeps the per-rank model states (frozen fragments, buffers); the
    // trainable params are in zero/<param>/.
    FC_ASSIGN_OR_RETURN(const std::vector<const PtFile*> models, Zero3Models(rf, dir_));
    FC_RETURN_IF_ERROR(AddFrozenZero3(models));
    return AddModule(*models[0], /*zero3_placeholders=*/true);
  }
  if (rf.model == nullptr && !rf.model_z3.empty()) {
    return NotFoundError(dir_ + ": ZeRO-3 model states without their *_optim_states.pt files "
                         "(the ZeRO-3 weights live only in the optimizer partitions)");
  }
  if (rf.model == nullptr) {
    return NotFoundError(dir_ + ": " + MpName(mp) + "_model_states.pt is missing");
  }
  if (!optims.empty()) {
    FC_RETURN_IF_ERROR(ReadZero12(*rf.model, optims, osds, variant == "bf16_optimizer"));
  } else if (universal_) {
    FC_RETURN_IF_ERROR(AddFrozenFull(*rf.model));
  }
  return AddModule(*rf.model, false);
}

// module tensors, buffers, the remaining module tensors and tied aliases.
Status Reader::AddModule(const PtFile& model, bool zero3_placeholders) {
  const PV* module = model.root.Find("module");
  const PickleEntries* entries = PickleDictEntries(module);
  if (module != nullptr && !module->is_none() && entries == nullptr) {
    return DataLossError(model.name + ": module is " + module->DebugString() +
                         ", expected a dict of tensors");
  }
  if (module == nullptr || module->is_none()) {
    if (!pipeline_) {
      return DataLossError(model.name + ": module is None, but there are no pipeline layer "
                           "files (layer_XX-model_YY-model_states.pt) holding the weights");
    }
  }
  std::set<std::string> buffer_names;
  if (const auto* b = PickleListItems(model.root.Find("buffer_names"))) {
    for (const auto& i : *b) {
      if (auto s = PickleStr(i.get())) buffer_names.insert(*s);
    }
  }
  for (const auto& [k, v] : entries ? *entries : PickleEntries()) {
    auto name = PickleStr(k.get());
    if (!name) return DataLossError(model.name + ": module key " + k->DebugString());
    if (v->is_none()) continue;
    FC_ASSIGN_OR_RETURN(Located l, model.Locate(v.get(), "module['" + *name + "']"));
    if (zero3_placeholders && l.numel == 0 && !buffer_names.count(*name)) continue;
    if (module_dtype_.empty() && !buffer_names.count(*name)) {
      module_dtype_ = std::string(DTypeName(l.dtype));
    }
    Chunk c = WholeChunk(l, model.index);
    FC_RETURN_IF_ERROR(module_.Add("module." + *name, l.dtype, l.shape, c, model.name));
    const std::string key = *name;
    if (buffer_names.count(*name)) {
      FC_RETURN_IF_ERROR(buffers_.Add(key, l.dtype, l.shape, c, model.name));
    } else if (!weights_.Has(key) && !frozen_.Has(key)) {
      FC_RETURN_IF_ERROR(other_.Add(key, l.dtype, l.shape, c, model.name));
    }
  }
  if (const PickleEntries* shared = PickleDictEntries(model.root.Find("shared_params"))) {
    for (const auto& [k, v] : *shared) {
      auto alias = PickleStr(k.get());
      auto owner = PickleStr(v.get());
      if (!alias || !owner) {
        return DataLossError(model.name + ": shared_params entry " + k->DebugString() + ": " +
                             v->DebugString() + " is not alias: owner");
      }
      aliases_[*alias] = *owner;
    }
  }
  return Status::Ok();
}

Families Reader::TakeFamilies() {
  Families f;
  Builder* builders[kFamilies] = {&weights_, &frozen_,  &buffers_,    &other_,
                                  &module_,  &exp_avg_, &exp_avg_sq_, &step_};
  for (size_t i = 0; i < kFamilies; ++i) f.tensors[i] = builders[i]->Take();
  f.aliases = std::move(aliases_);
  aliases_.clear();
  return f;
}

}  // namespace fc::deepspeed_internal
