// The megatron.* attributes of the legacy reader's index (reader.h): degrees and model facts,
// what became of the optimizer states, the Adam step, and the globals kept opaque.
#include <set>
#include <string>

#include "fc/codec/pickle_globals.h"
#include "src/format/megatron/reader.h"

namespace fc::megatron_internal {

void Reader::AddModelAttributes() {
  const Degrees& deg = ranks_.deg;
  auto& a = index_.attributes;
  a["megatron.tp_degree"] = std::to_string(deg.tp);
  a["megatron.pp_degree"] = std::to_string(deg.pp);
  a["megatron.ep_degree"] = std::to_string(deg.ep);
  a["megatron.vpp_degree"] = std::to_string(vpp_);
  a["megatron.num_layers"] = std::to_string(layers_);
  a["megatron.swiglu"] = swiglu_ ? (*swiglu_ ? "true" : "false") : "unknown";
  // The model facts of args that name mappings need (fc-export --hf-family): ints, bools
  // and strings as text, under megatron.args.<name>; absent when args lacks them.
  if (args_ != nullptr) {
    for (const char* k : {"num_attention_heads", "num_query_groups", "group_query_attention",
                          "kv_channels", "hidden_size", "ffn_hidden_size", "padded_vocab_size",
                          "add_qkv_bias", "add_bias_linear", "untie_embeddings_and_output_weights",
                          "num_experts", "normalization", "position_embedding_type"}) {
      const PV* v = args_->Find(k);
      if (v == nullptr) continue;
      if (auto i = PickleInt(v)) {
        a[std::string("megatron.args.") + k] = std::to_string(*i);
      } else if (auto b = PickleBool(v)) {
        a[std::string("megatron.args.") + k] = *b ? "true" : "false";
      } else if (v->is_str()) {
        a[std::string("megatron.args.") + k] = v->str;
      }
    }
  }
  if (deg.tp > 1) {
    a["megatron.tp_merge"] = options_.tp_axis ? "tensor_parallel rules of " + options_.tp_axis_origin
                                              : "built-in Megatron-Core GPT table";
  }
  if (!unmerged_.empty()) {
    std::string s;
    for (const std::string& u : unmerged_) s += (s.empty() ? "" : ", ") + u;
    a["megatron.tp_unmerged"] = s;
  }
  if (skipped_ > 0) {
    a["megatron.skipped"] = std::to_string(skipped_) + " non-tensor / _extra_state entries";
  }
}

void Reader::AddOptimizerAttributes() {
  auto& a = index_.attributes;
  if (opt_ == nullptr || opt_->is_none()) {
    a["megatron.optimizer"] = "absent";
  } else if (!optim_.empty()) {
    a["megatron.optimizer"] = std::string(float16_          ? "Float16 optimizer"
                                          : fp32_optimizer_ ? "FP32Optimizer"
                                                            : "distributed optimizer") +
                              ": fp32 master weights and Adam moments read "
                              "(optimizer.{fp32,exp_avg,exp_avg_sq}.<param>)";
  } else if (opt_->Find("param_state_sharding_type") != nullptr || distrib_optim_ > 0) {
    a["megatron.optimizer"] = "distributed optimizer, not read";
  } else if (float16_) {
    a["megatron.optimizer"] = "Float16 optimizer (fp32_from_fp16_params), not read: " +
                              optim_not_read_;
  } else if (fp32_optimizer_) {
    a["megatron.optimizer"] = "FP32Optimizer ({state, param_groups}), not read: " +
                              optim_not_read_;
  } else {
    a["megatron.optimizer"] = "present, not read";
  }
  if (distrib_optim_ > 0 && !optim_.empty()) {
    std::string rules;
    for (const std::string& r : optim_layouts_) rules += (rules.empty() ? "" : " | ") + r;
    a["megatron.distrib_optim"] = std::to_string(distrib_optim_) + " files, read (" + rules + ")";
    if (!frozen_.empty()) {
      std::string names;
      for (const std::string& n : frozen_) names += (names.empty() ? "" : ", ") + n;
      a["megatron.distrib_optim"] += "; " + std::to_string(frozen_.size()) +
                                     " param(s) in no buffer (frozen: no optimizer state): " +
                                     names;
    }
  } else if (distrib_optim_ > 0) {
    a["megatron.distrib_optim"] = std::to_string(distrib_optim_) + " files, not read: " +
                                  optim_not_read_;
  }
}

void Reader::AddOptimizerStep() {
  if (opt_ == nullptr) return;
  auto& a = index_.attributes;
  // The Adam step: Megatron keeps it per param group (FusedAdam), and the distributed
  // optimizer drops the groups' param lists, so it is an attribute, not a tensor.
  const PV* groups = opt0_ ? opt0_->Find("optimizer") : nullptr;
  groups = groups ? groups->Find("param_groups")
                  : (fp32_optimizer_ ? opt0_->Find("param_groups") : nullptr);
  std::set<int64_t> steps;
  if (groups != nullptr && groups->is_list()) {
    for (const auto& g : groups->items) {
      if (auto st = g ? PickleInt(g->Find("step")) : std::nullopt) steps.insert(*st);
    }
  }
  // torch's Adam/AdamW (Megatron-Core's optimizer without Transformer Engine or Apex, as on
  // CPU) keeps the step per param in its state, a 0-d float32 tensor (an int before torch
  // 1.12): seen in Megatron-Core 0.16.1's FP32Optimizer.state_dict().
  if (steps.empty() && (float16_ || fp32_optimizer_)) {
    const PV* inner = fp32_optimizer_ ? opt0_ : opt0_->Find("optimizer");
    const PV* states = inner ? inner->Find("state") : nullptr;
    if (states != nullptr) {
      for (const auto& [k, v] : states->entries) {
        const PV* step = v ? v->Find("step") : nullptr;
        if (step == nullptr) continue;
        if (auto st = PickleInt(step)) {
          steps.insert(*st);
        } else if (auto st2 = ScalarStep(*files_[0], *step)) {
          steps.insert(*st2);
        }
      }
    }
  }
  if (!steps.empty()) {
    std::string s;
    for (int64_t st : steps) s += (s.empty() ? "" : ", ") + std::to_string(st);
    a["megatron.optimizer_step"] = s;
  }
}

void Reader::AddOpaqueGlobals() {
  auto& a = index_.attributes;
  std::set<std::string> opaque;
  for (const auto& f : files_) CollectUnknownGlobals(f->root, TorchSaveDataGlobal, &opaque);
  if (!opaque.empty()) {
    std::string s;
    for (const std::string& g : opaque) s += (s.empty() ? "" : ", ") + g;
    a["megatron.opaque_globals"] = s;
  }
}

}  // namespace fc::megatron_internal
