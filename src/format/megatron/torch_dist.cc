// Megatron-Core's torch_dist additions to a torch DCP checkpoint (torch_dist.h).
#include "src/format/megatron/torch_dist.h"

#include <charconv>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>

#include "fc/core/checked_math.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"

namespace fc::megatron_internal {
namespace {

using json_internal::ShapeText;

// The "step" values of every param group under `v` (a state dict's optimizer entry, nested
// as the optimizer classes nest it: dicts, ChainedOptimizer lists). Visits at most `budget`
// nodes, `depth` levels.
void CollectParamGroupSteps(const PickleValue& v, int depth, int64_t* budget,
                            std::set<std::string>* steps) {
  if (depth > 16 || --*budget < 0) return;
  for (const auto& [k, value] : v.entries) {
    if (!value) continue;
    if (k && k->is_str() && k->str == "param_groups" && value->is_list()) {
      for (const auto& group : value->items) {
        const PickleValue* step = group ? group->Find("step") : nullptr;
        if (step == nullptr) continue;
        if (step->is_int()) {
          steps->insert(std::to_string(step->int_value));
        } else if (step->kind == PickleValue::Kind::kFloat && step->float_value >= 0 &&
                   step->float_value < 9.0e15 &&
                   step->float_value == static_cast<double>(static_cast<int64_t>(step->float_value))) {
          steps->insert(std::to_string(static_cast<int64_t>(step->float_value)));
        } else {
          steps->insert(step->DebugString(40));
        }
      }
    }
    CollectParamGroupSteps(*value, depth + 1, budget, steps);
  }
  for (const auto& item : v.items) {
    if (item) CollectParamGroupSteps(*item, depth + 1, budget, steps);
  }
}

// The string values of every `key` entry under `v` (dicts and lists, as CollectParamGroupSteps
// walks them).
void CollectStrings(const PickleValue& v, std::string_view key, int depth, int64_t* budget,
                    std::set<std::string>* out) {
  if (depth > 16 || --*budget < 0) return;
  for (const auto& [k, value] : v.entries) {
    if (!value) continue;
    if (k && k->is_str() && k->str == key && value->is_str()) out->insert(value->str);
    CollectStrings(*value, key, depth + 1, budget, out);
  }
  for (const auto& item : v.items) {
    if (item) CollectStrings(*item, key, depth + 1, budget, out);
  }
}

// The value of a one-element tensor pickled in a torch.save archive (common.pt), as text:
// an integral float or an integer in decimal, another float in shortest form; nullopt for
// anything else (not a tensor, several elements, a dtype other than f32/f64/i32/i64, a
// missing or out-of-range record).
std::optional<std::string> ScalarTensorText(const PickleValue& v,
                                            const TorchSaveArchive& archive,
                                            const ZipReadFn& read) {
  auto ref = DecodeTorchTensor(v);
  if (!ref.ok()) return std::nullopt;
  for (int64_t d : ref->shape) {
    if (d != 1) return std::nullopt;
  }
  const DType dt = ref->dtype;
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kInt32 &&
      dt != DType::kInt64) {
    return std::nullopt;
  }
  const ZipEntry* e = archive.FindRecord("data/" + ref->storage_key);
  const uint64_t size = DTypeSize(dt);
  // In range: DecodeTorchTensor checked that the view fits the storage it claims.
  const uint64_t at = static_cast<uint64_t>(ref->storage_offset) * size;
  if (e == nullptr || e->method != 0 || at + size > e->compressed_size) return std::nullopt;
  std::byte b[8];
  if (!read(e->data_offset + at, std::span<std::byte>(b, size)).ok()) return std::nullopt;
  double x = 0;
  if (dt == DType::kFloat32) {
    float f;
    std::memcpy(&f, b, 4);
    x = f;
  } else if (dt == DType::kFloat64) {
    std::memcpy(&x, b, 8);
  } else if (dt == DType::kInt32) {
    int32_t i;
    std::memcpy(&i, b, 4);
    return std::to_string(i);
  } else {
    int64_t i;
    std::memcpy(&i, b, 8);
    return std::to_string(i);
  }
  if (x >= 0 && x < 9.0e15 && x == static_cast<double>(static_cast<int64_t>(x))) {
    return std::to_string(static_cast<int64_t>(x));
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

// The non-distributed optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params) keep the
// torch optimizer's per-param step as one value: MegatronOptimizer.
// _extract_common_per_param_step puts it in their sharded state dict as
// state["common_step"], a 0-d tensor (torch Adam's step), which dist_checkpointing saves in
// common.pt (seen in Megatron-Core 0.16.1's saves). Collected like CollectParamGroupSteps.
void CollectCommonSteps(const PickleValue& v, int depth, int64_t* budget,
                        const TorchSaveArchive& archive, const ZipReadFn& read,
                        std::set<std::string>* steps) {
  if (depth > 16 || --*budget < 0) return;
  for (const auto& [k, value] : v.entries) {
    if (!value) continue;
    if (k && k->is_str() && k->str == "common_step") {
      if (value->is_int()) {
        steps->insert(std::to_string(value->int_value));
      } else if (auto text = ScalarTensorText(*value, archive, read)) {
        steps->insert(*text);
      }
      continue;
    }
    CollectCommonSteps(*value, depth + 1, budget, archive, read, steps);
  }
  for (const auto& item : v.items) {
    if (item) CollectCommonSteps(*item, depth + 1, budget, archive, read, steps);
  }
}

}  // namespace

Result<int64_t> UndoMegatronReformulation(const PickleValue& mcore_data,
                                          std::vector<TensorEntry>& tensors) {
  std::unordered_map<std::string_view, TensorEntry*> by_key;
  for (TensorEntry& t : tensors) by_key.emplace(t.key, &t);
  int64_t restored = 0;
  for (const auto& [k, v] : mcore_data.entries) {
    if (!k || !k->is_str() || !v || !v->is_dict()) continue;
    const PickleValue* orig = v->Find("nd_reformulated_orig_global_shape");
    if (orig == nullptr) continue;
    auto it = by_key.find(k->str);
    if (it == by_key.end()) continue;  // (a tensor of another rank's metadata file)
    TensorEntry& t = *it->second;
    const std::string where = "tensor '" + t.key + "': mcore_data nd_reformulated_orig_global_shape";
    Shape shape;
    if (orig->is_tuple() || orig->is_list()) {
      for (const auto& d : orig->items) {
        if (!d || !d->is_int() || d->int_value < 0) break;
        shape.push_back(d->int_value);
      }
    }
    if ((!orig->is_tuple() && !orig->is_list()) || shape.size() != orig->items.size()) {
      return DataLossError(where + " is " + orig->DebugString(60) + ", not a shape");
    }
    const Shape& stored = t.global_shape;  // axis_fragmentations + (fragment numel,)
    if (stored.size() != shape.size() + 1) {
      return DataLossError(where + " " + ShapeText(shape) + " does not fit the stored shape " +
                           ShapeText(stored) + " (expected one more axis)");
    }
    Shape local(shape.size());
    int64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (stored[i] <= 0 || shape[i] % stored[i] != 0) {
        return DataLossError(where + " " + ShapeText(shape) + ": axis " + std::to_string(i) +
                             " does not split into the stored shape's " +
                             std::to_string(stored[i]) + " fragments");
      }
      local[i] = shape[i] / stored[i];
      const std::optional<int64_t> n = CheckedMul(numel, local[i]);
      if (!n) return DataLossError(where + " " + ShapeText(shape) + " overflows");
      numel = *n;
    }
    if (numel != stored.back()) {
      return DataLossError(where + " " + ShapeText(shape) + ": a fragment holds " +
                           std::to_string(numel) + " elements, the stored shape " +
                           ShapeText(stored) + " says " + std::to_string(stored.back()));
    }
    for (Chunk& c : t.chunks) {
      Box& box = c.box;  // (fragment index..., range start), (1, ..., 1, range length)
      for (size_t i = 0; i < shape.size(); ++i) {
        if (box.local_shape[i] != 1) {
          return DataLossError("tensor '" + t.key + "' chunk " + box.ToString() +
                               ": spans more than one fragment of a reformulated tensor "
                               "(sizes must be 1 on every axis but the last)");
        }
      }
      const int64_t range_start = box.global_offset.back();
      c.flat_range = FlatRange{range_start, range_start + box.local_shape.back()};
      box.global_offset.pop_back();
      for (size_t i = 0; i < shape.size(); ++i) box.global_offset[i] *= local[i];
      box.local_shape = local;
    }
    t.global_shape = shape;
    ++restored;
  }
  return restored;
}

void AddMcoreDataAttributes(const PickleValue& mcore_data, CheckpointIndex* index) {
  auto& a = index->attributes;
  a["mcore_data"] = mcore_data.is_dict()
                        ? std::to_string(mcore_data.entries.size()) + " entries"
                        : std::string(PickleKindName(mcore_data.kind));
  // Megatron's N-D flattened reformulation is only reversible with the original shape:
  // listed for the keys that name no tensor (the others now have that shape; Read undid
  // it). (Bounded: the memo could make every key share one huge dict.)
  uint64_t scanned = 0;
  for (const auto& [k, v] : mcore_data.entries) {
    if (!k->is_str() || !v->is_dict()) continue;
    scanned += v->entries.size();
    if (scanned > (uint64_t{1} << 22)) break;
    const PickleValue* orig = v->Find("nd_reformulated_orig_global_shape");
    if (orig == nullptr || (!orig->is_tuple() && !orig->is_list())) continue;
    if (index->FindTensor(k->str) != nullptr) continue;
    Shape shape;
    for (const auto& d : orig->items) shape.push_back(d->is_int() ? d->int_value : -1);
    a["mcore_data." + k->str + ".nd_reformulated_orig_global_shape"] = ShapeText(shape);
  }
}

// Megatron-Core's dist checkpointing (torch_dist) saves what is not sharded beside the DCP
// files as common.pt, a torch.save of the rest of the state dict (args, iteration, the
// optimizer's param groups, ...). Three values are read from it: "iteration", the Adam
// step the param groups carry (what a Universal Checkpoint's step.pt needs) and the
// distributed optimizer's param_state_sharding_type (which says whether its states are per
// param, optimizer.state.<state>.<key>, or flat per-bucket buffers), and Megatron-LM's args'
// model facts (megatron.args.<name>); the non-distributed
// optimizers' step is optimizer.state.common_step, a 0-d tensor. Best effort:
// a common.pt fc cannot parse is reported in the attribute, not an error of the checkpoint.
void AddMegatronCommon(const std::string& dir, std::map<std::string, std::string>& a) {
  const std::string path = JoinPath(dir, "common.pt");
  auto file = RandomAccessFile::Open(path);
  if (!file.ok()) {
    a["megatron_common_pt"] = "present, not read: " + file.status().message();
    return;
  }
  const RandomAccessFile* f = file->get();
  ZipReadFn read = [f](uint64_t off, std::span<std::byte> dst) { return f->ReadAt(off, dst); };
  auto archive = ReadTorchSaveArchive(f->size(), read);
  Result<PickleValue> root = archive.ok() ? ReadTorchSavePickle(*archive, read, uint64_t{16} << 20)
                                          : Result<PickleValue>(archive.status());
  if (!root.ok()) {
    a["megatron_common_pt"] = "present, not read: " + root.status().message();
    return;
  }
  std::string found;
  if (const PickleValue* it = root->Find("iteration"); it != nullptr && it->is_int()) {
    a["megatron.iteration"] = std::to_string(it->int_value);
    found = "iteration";
  }
  // Megatron-LM's args (an argparse.Namespace): the model facts name mappings need
  // (fc-export --hf-family), as megatron.args.<name>, like the legacy reader's.
  if (const PickleValue* args = root->Find("args")) {
    const PickleValue* dict = nullptr;
    if (args->is_dict()) {
      dict = args;
    } else if (const PickleValue* g = args->CalleeGlobal();
               g != nullptr && g->IsGlobal("argparse", "Namespace") && args->state &&
               args->state->is_dict()) {
      dict = args->state.get();
    }
    if (dict != nullptr) {
      for (const char* k : {"num_attention_heads", "num_query_groups", "group_query_attention",
                            "kv_channels", "hidden_size", "ffn_hidden_size", "padded_vocab_size",
                            "swiglu", "add_qkv_bias", "add_bias_linear",
                            "untie_embeddings_and_output_weights", "num_experts", "num_layers",
                            "normalization", "position_embedding_type"}) {
        const PickleValue* v = dict->Find(k);
        if (v == nullptr) continue;
        if (v->is_int()) {
          a[std::string("megatron.args.") + k] = std::to_string(v->int_value);
        } else if (v->kind == PickleValue::Kind::kBool) {
          a[std::string("megatron.args.") + k] = v->bool_value ? "true" : "false";
        } else if (v->is_str()) {
          a[std::string("megatron.args.") + k] = v->str;
        }
      }
    }
  }
  std::set<std::string> steps, sharding;
  if (const PickleValue* opt = root->Find("optimizer")) {
    int64_t budget = 1 << 20;
    CollectParamGroupSteps(*opt, 0, &budget, &steps);
    budget = 1 << 20;
    CollectCommonSteps(*opt, 0, &budget, *archive, read, &steps);
    budget = 1 << 20;
    CollectStrings(*opt, "param_state_sharding_type", 0, &budget, &sharding);
  }
  // Each value found becomes an attribute (several joined by ", ") and is named in `found`.
  auto report = [&](const std::set<std::string>& values, const char* attribute,
                    const char* what) {
    if (values.empty()) return;
    std::string joined;
    for (const std::string& v : values) joined += (joined.empty() ? "" : ", ") + v;
    a[attribute] = joined;
    found += std::string(found.empty() ? "" : ", ") + what;
  };
  report(steps, "megatron.optimizer_step", "the param groups' Adam step");
  report(sharding, "megatron.optimizer_sharding_type", "the optimizer's sharding type");
  a["megatron_common_pt"] = found.empty() ? "present (no iteration, no param group step)"
                                          : "read: " + found;
}

}  // namespace fc::megatron_internal
