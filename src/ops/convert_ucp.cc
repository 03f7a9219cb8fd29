// fc-convert --output-format ucp. Contract: src/ops/convert_ucp.h.
//
// The run is an export whose files hold one tensor each: the planner cuts every param file
// into write items under the budget, the executor assembles them from the source's pieces
// (ZeRO flat partitions, TP slices: every byte read once) and the UcpWriter puts them at
// their final place in the staging directory. Everything else (optimizer_state.pt, the
// model states, an int step) is small or copied in bounded blocks.
#include "src/ops/convert_ucp.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <re2/re2.h>
#include <spdlog/spdlog.h>

#include "fc/aoa/engine.h"
#include "fc/aoa/program.h"
#include "fc/core/checked_math.h"
#include "fc/exec/assemble.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/optimizer_names.h"
#include "fc/format/ucp_writer.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/ops/report_format.h"
#include "fc/ops/run_stats.h"
#include "fc/ops/targets.h"
#include "fc/plan/plan.h"
#include "src/ops/convert_job.h"
#include "src/ops/job.h"
#include "src/ops/plan_report.h"
#include "src/ops/shared_input.h"
#include "src/ops/staged_files.h"

namespace fc {
namespace {

constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};
constexpr uint64_t kCopyBlock = uint64_t{16} << 20;

// The source tensor holding `state` of `param` (deepspeed.h names).
std::string SourceKey(const std::string& param, std::string_view state) {
  return state == "fp32" ? param : "optimizer." + std::string(state) + "." + param;
}

}  // namespace

Status CheckUcpOptions(const ConvertOptions& o) {
  std::vector<std::string> given;
  if (!o.target_like.empty()) given.push_back("--target-like");
  if (!o.target_layout_file.empty()) given.push_back("--target-layout");
  if (!o.preset.empty()) given.push_back("--preset");
  if (!o.target_manifest.empty()) given.push_back("--target-manifest");
  if (!o.emit_manifest.empty()) given.push_back("--emit-manifest");
  if (!o.include.empty() || !o.exclude.empty()) given.push_back("--include/--exclude");
  if (o.dtype) given.push_back("--dtype");
  if (!o.torch_version.empty() || !o.torch_serialization.empty()) given.push_back("--torch-*");
  if (!given.empty()) {
    return InvalidArgumentError("--output-format ucp writes every param whole, in fp32, as "
                                "DeepSpeed's loader expects: " + given.front() +
                                " does not apply");
  }
  if (o.dry_run && o.simulate_processes > 0) {
    return UnimplementedError("--output-format ucp: --simulate-processes does not apply (one process)");
  }
  return Status::Ok();
}

namespace {

// The tensors a param's file is made of: one global tensor, or (TP > 1 without
// universal_checkpoint_info, with inject_missing_state) the TP ranks' slices, concatenated
// along dim 0 in rank order.
struct UcpParam {
  std::string name;
  std::vector<const TensorEntry*> states[3];  // fp32, exp_avg, exp_avg_sq (kStates order)
  const TensorEntry* step = nullptr;          // TP rank 0's
  // --aoa: the program's output for each state (kStates order; the fp32 one only with
  // --ucp-fresh-optimizer), used instead of `states`.
  std::vector<OutputTensor> mapped;
};

// The roles in a source that is not DeepSpeed's, found by AdamNamesOf; every tensor of a
// param the same shape, floating point (cast to fp32 when written), and a step tensor each
// unless `step_given` (the source keeps it per param group, megatron.optimizer_step, or
// --ucp-step gives it).
Result<std::vector<UcpParam>> NamedUcpParams(const CheckpointIndex& index,
                                             const std::string& input, bool step_given,
                                             std::vector<const TensorEntry*>* steps,
                                             std::vector<std::string>* unused) {
  std::vector<UcpParam> params;
  std::set<std::string> seen, used;
  for (const TensorEntry& t : index.tensors) {
    const std::vector<AdamNames> candidates = AdamNamesOf(t.key);
    if (candidates.empty()) continue;
    const AdamNames* names = &candidates.front();
    const TensorEntry* sq = nullptr;
    for (const AdamNames& c : candidates) {
      if ((sq = index.FindTensor(c.exp_avg_sq)) != nullptr) {
        names = &c;
        break;
      }
    }
    if (!seen.insert(names->param).second) continue;
    UcpParam param;
    param.name = names->param;
    const TensorEntry* weight = nullptr;
    for (const std::string& w : names->weights) {
      if ((weight = index.FindTensor(w)) != nullptr) break;
    }
    if (weight == nullptr) {
      std::string looked;
      for (const std::string& w : names->weights) looked += (looked.empty() ? "" : ", ") + w;
      return InvalidArgumentError(input + ": " + t.key + " has no weight (looked for " + looked +
                                  ")");
    }
    if (sq == nullptr) {
      return InvalidArgumentError(input + ": " + t.key + " has no " + names->exp_avg_sq);
    }
    const TensorEntry* step = names->step.empty() ? nullptr : index.FindTensor(names->step);
    if (step == nullptr && !step_given) {
      return InvalidArgumentError(
          input + ": " + t.key +
          (names->step.empty() ? ": " + std::string(names->writer) +
                                     " keeps no Adam step with the states"
                               : " has no step tensor " + names->step) +
          " (a Universal Checkpoint's moments need the step: give --ucp-step N, the iteration "
          "they belong to)");
    }
    for (const TensorEntry* e : {weight, &t, sq}) {
      if (!IsFloating(e->dtype)) {
        return InvalidArgumentError(input + ": " + e->key + " is " +
                                    std::string(DTypeName(e->dtype)) +
                                    ", not a floating-point weight or Adam state");
      }
      if (e->global_shape != weight->global_shape) {
        return InvalidArgumentError(input + ": " + e->key + " has shape " +
                                    Box::Whole(e->global_shape).ToString() + ", its weight " +
                                    weight->key + " " + Box::Whole(weight->global_shape).ToString());
      }
      used.insert(e->key);
    }
    param.states[0] = {weight};
    param.states[1] = {&t};
    param.states[2] = {sq};
    if (step != nullptr) {
      used.insert(step->key);
      steps->push_back(step);
    }
    // The 16-bit weights a master weight stands for, and the step's powers: carried over.
    if (std::find(names->weights.begin(), names->weights.begin() + names->masters,
                  weight->key) != names->weights.begin() + names->masters) {
      for (const std::string& w : names->weights) used.insert(w);
    }
    for (const std::string& power : names->step_powers) used.insert(power);
    params.push_back(std::move(param));
  }
  if (params.empty()) {
    // Megatron-Core's distributed optimizer in its flat forms: per-bucket buffers whose
    // params nothing in the checkpoint names (dp_reshardable's are tensors,
    // dp_zero_gather_scatter's one pickled object per DP group).
    const std::string type = index.Attribute("megatron.optimizer_sharding_type");
    std::string flat;
    for (const TensorEntry& t : index.tensors) {
      if (t.key.find("optimizer.distributed.dp_group_idx_") != std::string::npos) {
        flat = t.key;
        break;
      }
    }
    if (!flat.empty() || type.starts_with("dp_") || type == "fully_sharded_bucket_space") {
      // dp_reshardable buckets are mapped to params when they can be (megatron_buckets.h);
      // the reader says why these were not.
      const std::string why = index.Attribute("megatron.optimizer_buckets");
      return UnimplementedError(
          input + ": Megatron's distributed optimizer saved its states as flat per-bucket "
          "buffers (" + (flat.empty() ? std::string() : flat + "; ") + "sharding type " +
          (type.empty() ? std::string("not recorded") : type) + ")" +
          (why.empty() ? std::string(", which name no params")
                       : "; " + why) +
          "; without that mapping fc needs a per-param form, which Megatron writes "
          "with --dist-ckpt-optim-fully-reshardable (Megatron-Core 0.14 on) or "
          "--ckpt-fully-parallel-save (0.8 to 0.13): load and save it once with that flag");
    }
    return InvalidArgumentError(
        input + ": no Adam states found (torch's optim.state.<param>.exp_avg or "
        "optimizer.state.<param>.exp_avg, Megatron torch_dist's optimizer.state.exp_avg.<param>, "
        "fc's optimizer.exp_avg.<param> or PaddlePaddle's <param>.moment1_0, each with its "
        "second moment): nothing a Universal Checkpoint holds");
  }
  for (const TensorEntry& t : index.tensors) {
    if (!used.count(t.key)) unused->push_back(t.key);
  }
  return params;
}

// --ucp-fresh-optimizer: every floating-point tensor is a param whose moments are zeros (an
// empty states[1] / states[2]); refused when the source has Adam states by AdamNamesOf.
Result<std::vector<UcpParam>> FreshUcpParams(const CheckpointIndex& index,
                                             const std::string& input,
                                             std::vector<std::string>* unused) {
  std::vector<UcpParam> params;
  for (const TensorEntry& t : index.tensors) {
    if (!AdamNamesOf(t.key).empty()) {
      return InvalidArgumentError(input + ": " + t.key + " is an Adam state: leave out "
                                  "--ucp-fresh-optimizer to carry the optimizer over");
    }
    if (!IsFloating(t.dtype)) {
      unused->push_back(t.key);
      continue;
    }
    UcpParam param;
    param.name = t.key;
    param.states[0] = {&t};
    params.push_back(std::move(param));
  }
  if (params.empty()) {
    return InvalidArgumentError(input + ": no floating-point tensors: nothing a Universal "
                                "Checkpoint holds");
  }
  return params;
}

// --aoa over a source that is not DeepSpeed's. The program sees each param under its UCP name
// and its Adam states as <name>.exp_avg and <name>.exp_avg_sq (the engine's state suffixes,
// and only those: PaddlePaddle's .w_0 would end a param name), so whatever it does to a
// param (rename, split, concatenate, transpose, fused QKV, padding) it does to the param's
// moments too; a param it removes (`name -> _`) is not written. Its casts (dtype=) are
// refused: a UCP holds fp32.
Result<std::vector<UcpParam>> MapUcpParams(const std::vector<UcpParam>& params,
                                           const std::string& aoa_text,
                                           const std::string& origin) {
  constexpr std::array<std::string_view, 3> kSuffix = {"", ".exp_avg", ".exp_avg_sq"};
  aoa::EngineOptions engine_options;
  engine_options.state_suffixes.suffixes = {std::string(kSuffix[1]), std::string(kSuffix[2])};
  engine_options.state_suffixes.scalar_suffixes.clear();
  std::vector<aoa::TensorMeta> metas;
  std::map<std::string, const TensorEntry*> by_key;
  const bool fresh = !params.empty() && params.front().states[1].empty();
  for (const UcpParam& p : params) {
    if (!aoa::SplitStateSuffix(p.name, engine_options.state_suffixes).suffix.empty()) {
      return InvalidArgumentError(origin + ": param '" + p.name + "' ends in an Adam state's "
                                  "suffix, which the program could not tell from its state");
    }
    for (size_t s = 0; s < (fresh ? 1 : 3); ++s) {
      const TensorEntry* e = p.states[s].front();
      const std::string key = p.name + std::string(kSuffix[s]);
      by_key.emplace(key, e);
      aoa::TensorMeta meta{key, e->dtype, e->global_shape, {}};
      for (const Chunk& c : e->chunks) {
        if (c.replica_id == 0) meta.chunks.push_back(c.box);
      }
      metas.push_back(std::move(meta));
    }
  }
  FC_ASSIGN_OR_RETURN(aoa::AoaProgram program, aoa::ParseAoaProgram(aoa_text, origin));
  FC_ASSIGN_OR_RETURN(aoa::AoaEngine engine,
                      aoa::AoaEngine::Create(program, metas, std::nullopt, engine_options));
  for (const std::string& w : engine.warnings()) spdlog::warn("{}", w);
  auto resolve = [&by_key](const std::string& key) -> const TensorEntry* {
    auto it = by_key.find(key);
    return it == by_key.end() ? nullptr : it->second;
  };
  std::vector<UcpParam> mapped;
  for (const aoa::OutputTensor& param : engine.ListOutputs(/*with_states=*/false)) {
    if (!param.has_data) continue;
    UcpParam p;
    p.name = param.key;
    for (size_t s = 0; s < (fresh ? 1 : 3); ++s) {
      FC_ASSIGN_OR_RETURN(aoa::OutputTensor out,
                          engine.Output(param.key + std::string(kSuffix[s])));
      FC_ASSIGN_OR_RETURN(OutputTensor tensor, OutputFromEngine(engine, out, resolve));
      for (const SourcePiece& piece : tensor.pieces) {
        for (const PieceOp& op : piece.ops) {
          if (s == 0 && op.kind == PieceOp::Kind::kCast) {
            return InvalidArgumentError(origin + ": '" + param.key + "' is cast to " +
                                        std::string(DTypeName(op.dtype)) + ": a Universal "
                                        "Checkpoint holds fp32 params (leave out dtype=)");
          }
        }
      }
      p.mapped.push_back(std::move(tensor));
    }
    mapped.push_back(std::move(p));
  }
  if (mapped.empty()) {
    return InvalidArgumentError(origin + ": the program leaves no param to write");
  }
  return mapped;
}

// The value of a one-element step tensor, as a non-negative integer.
Result<int64_t> StepValue(ChunkReader& reader, const TensorEntry& step) {
  const Result<int64_t> n = CheckedNumElements(step.global_shape);
  if (!n.ok() || *n != 1 || step.chunks.size() != 1) {
    return InvalidArgumentError(step.key + ": a step of shape " +
                                Box::Whole(step.global_shape).ToString() +
                                ", expected one element");
  }
  alignas(8) std::byte buf[8] = {};
  const Box whole = Box::Whole(step.global_shape);
  FC_RETURN_IF_ERROR(reader.CopyChunkRegion(step, step.chunks[0], whole, buf, whole));
  double value = 0;
  switch (step.dtype) {
    case DType::kFloat32: { float f; std::memcpy(&f, buf, 4); value = f; break; }
    case DType::kFloat64: std::memcpy(&value, buf, 8); break;
    case DType::kInt64: { int64_t i; std::memcpy(&i, buf, 8); value = static_cast<double>(i); break; }
    case DType::kInt32: { int32_t i; std::memcpy(&i, buf, 4); value = i; break; }
    default:
      return InvalidArgumentError(step.key + ": a step of dtype " +
                                  std::string(DTypeName(step.dtype)));
  }
  if (!(value >= 0) || value > 9.0e15 || value != static_cast<double>(static_cast<int64_t>(value))) {
    return InvalidArgumentError(step.key + ": step " + std::to_string(value) +
                                " is not a count of steps");
  }
  return static_cast<int64_t>(value);
}

// The one step every param has (DeepSpeed keeps one per param group, and a synthesized UCP
// has one group).
Result<int64_t> CommonStep(const CheckpointIndex& index,
                           const std::vector<const TensorEntry*>& steps) {
  ChunkReader reader(index);
  std::optional<int64_t> common;
  const TensorEntry* first = nullptr;
  for (const TensorEntry* s : steps) {
    FC_ASSIGN_OR_RETURN(int64_t v, StepValue(reader, *s));
    if (common && v != *common) {
      return UnimplementedError(first->key + " is " + std::to_string(*common) + " but " +
                                s->key + " is " + std::to_string(v) +
                                ": a Universal Checkpoint written by fc has one param group, "
                                "whose params share one step");
    }
    common = v;
    if (first == nullptr) first = s;
  }
  return common.value_or(0);
}

// The roles: which params the UCP holds, refused with what is missing.
Result<std::vector<UcpParam>> UcpParams(const CheckpointIndex& index,
                                        const ConvertOptions& options) {
  const std::string& input = options.input;
  const std::string optimizer = index.Attribute("deepspeed.optimizer");
  if (optimizer.empty() || optimizer == "none") {
    return InvalidArgumentError(input + ": no fp32 master weights (no optimizer files: stage 0 "
                                "or a weights-only copy); a Universal Checkpoint needs them");
  }
  if (!index.Attribute("deepspeed.moe").empty()) {
    // DeepSpeed's universal loader looks each param up as zero/<name> under its local
    // (per expert-parallel rank) expert name: it is not expert-parallel aware, so a UCP of
    // global expert names would not load, and one of local names cannot hold every rank.
    return UnimplementedError(input + ": MoE checkpoint (deepspeed.moe): DeepSpeed's universal "
                              "checkpoint loader does not support expert parallelism (it looks "
                              "params up by their local expert names), so no UCP is written; "
                              "fc-export --include-optimizer writes every expert's fp32 weights "
                              "and Adam states under global names");
  }
  if (const std::string u = index.Attribute("deepspeed.tp_unmerged"); !u.empty()) {
    return UnimplementedError(input + ": TP shards fc does not merge (averaged params): " + u);
  }
  const std::string tp_text = index.Attribute("deepspeed.tp_degree");
  const int64_t tp = tp_text.empty() ? 1 : std::stoll(tp_text);
  if (constexpr std::string_view kByRules = "tensor_parallel rules of ";
      index.Attribute("deepspeed.tp_merge").starts_with(kByRules)) {
    return UnimplementedError(input + ": TP shards merged by " +
                              index.Attribute("deepspeed.tp_merge").substr(kByRules.size()) +
                              ": a Universal Checkpoint records its merge as "
                              "universal_checkpoint_info patterns, which fc does not derive "
                              "from layout rules; leave out --source-layout");
  }
  const bool per_rank = tp > 1 && index.Attribute("deepspeed.tp_merge") != "universal_checkpoint_info";
  if (per_rank && !options.ucp_inject_missing_state) {
    return UnimplementedError(input + ": TP degree " + tp_text + " without "
                              "universal_checkpoint_info: nothing says how the TP shards "
                              "concatenate (--inject-missing-state concatenates every param "
                              "along dim 0, as ds_to_universal.py --inject_missing_state)");
  }
  auto rank_key = [&](int64_t r, const std::string& key) {
    return per_rank ? std::string("mp_rank_") + (r < 10 ? "0" : "") + std::to_string(r) + "." + key
                    : key;
  };
  std::vector<UcpParam> params;
  std::set<std::string> seen;
  const std::string prefix = rank_key(0, "optimizer.exp_avg.");
  for (const TensorEntry& t : index.tensors) {
    if (!t.key.starts_with(prefix)) continue;
    UcpParam param;
    param.name = t.key.substr(prefix.size());
    if (!seen.insert(param.name).second) continue;
    for (size_t s = 0; s < 3; ++s) {
      for (int64_t r = 0; r < (per_rank ? tp : 1); ++r) {
        const std::string key = rank_key(r, SourceKey(param.name, kStates[s]));
        const TensorEntry* e = index.FindTensor(key);
        if (e == nullptr) {
          return InvalidArgumentError(input + ": param '" + param.name + "' has exp_avg but no " +
                                      key + " (" + kStates[s] + ")");
        }
        if (e->dtype != DType::kFloat32) {
          return InvalidArgumentError(input + ": " + key + " is " +
                                      std::string(DTypeName(e->dtype)) +
                                      ", not float32: no fp32 master weights / Adam states");
        }
        param.states[s].push_back(e);
      }
    }
    param.step = index.FindTensor(rank_key(0, "optimizer.step." + param.name));
    params.push_back(std::move(param));
  }
  if (params.empty()) {
    return InvalidArgumentError(input + ": no optimizer.exp_avg.<param> tensors: no Adam "
                                "states, nothing a Universal Checkpoint holds");
  }
  return params;
}

// A step saved as a Python int (attribute deepspeed.step[.group<g>]): the one value, when
// every group has the same one.
Result<std::optional<int64_t>> IntStep(const CheckpointIndex& index) {
  std::set<std::string> values;
  for (const auto& [k, v] : index.attributes) {
    if (k == "deepspeed.step" || k.starts_with("deepspeed.step.group")) values.insert(v);
  }
  if (values.empty()) return std::optional<int64_t>();
  if (values.size() > 1) {
    return UnimplementedError("the param groups' steps differ (Python ints: " +
                              *values.begin() + ", " + *values.rbegin() +
                              ") and fc does not know each param's group");
  }
  return std::optional<int64_t>(std::stoll(*values.begin()));
}

struct UcpJob {
  CheckpointIndex index;
  std::vector<UcpParam> params;
  UcpSource source;
  std::vector<UcpFileSpec> specs;       // plan file i == specs[i]
  std::vector<std::string> int_steps;   // step.pt paths holding the int step
  std::optional<int64_t> int_step;
  std::vector<std::string> unused;      // a synthesized UCP: source tensors left out
  Plan plan;
};

// A param name becomes the directory zero/<name>/: one path component.
Status CheckParamName(const std::string& input, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return InvalidArgumentError(input + ": param name '" + name +
                                "' cannot be a directory name under zero/");
  }
  return Status::Ok();
}

// ds_to_universal (0.19, ZeRO 1/2 and BF16_Optimizer) also writes zero/<name>/fp32.pt as
// {'param': tensor.float()} for every entry of the model states' module state dict that got
// no file from the optimizer fragments (frozen params, tied aliases, buffers): it goes
// through the mp_rank_XX_model_states.pt files in order and the first copy of a name wins
// (TP rank 0's, as that rank holds it; a pipeline's files hold no module: nothing). The same
// here: each module.<name> tensor (or its per-rank forms) whose data lies in an
// mp_rank_XX_model_states.pt file, the lowest XX's piece, cast to float32.
template <typename AddPieces>
Status AddModuleOnlyFiles(const std::string& input, const CheckpointIndex& index,
                          const std::vector<UcpParam>& params, AddPieces& add_pieces) {
  static const RE2 kModelStates(R"((?:.*/)?mp_rank_(\d+)_model_states\.pt)");
  static const RE2 kRankPrefix(R"(mp_rank_(\d+)\.(.+))");
  std::set<std::string> have;
  for (const UcpParam& p : params) have.insert(p.name);
  struct Pick {
    int64_t rank = 0;
    const TensorEntry* entry = nullptr;
    const Chunk* chunk = nullptr;
  };
  std::map<std::string, Pick> picks;
  std::vector<std::string> order;
  for (const TensorEntry& t : index.tensors) {
    // module.<name>, module.mp_rank_YY.<name> (buffers kept per TP rank) or
    // mp_rank_YY.module.<name> (TP without universal_checkpoint_info)
    std::string name = t.key;
    std::string rank_text;
    std::string rest;
    if (RE2::FullMatch(name, kRankPrefix, &rank_text, &rest)) name = rest;
    if (!name.starts_with("module.")) continue;
    name = name.substr(7);
    if (RE2::FullMatch(name, kRankPrefix, &rank_text, &rest)) name = rest;
    if (have.count(name)) continue;
    std::optional<Pick> best;
    bool other_file = false;
    for (const Chunk& c : t.chunks) {
      if (c.file >= index.files.size()) {
        return InternalError(t.key + ": chunk file " + std::to_string(c.file) + " out of range");
      }
      std::string file_rank;
      if (!RE2::FullMatch(index.files[c.file].path, kModelStates, &file_rank)) {
        other_file = true;  // a pipeline layer file or an expert file
        break;
      }
      const int64_t r = std::stoll(file_rank);
      if (best && r == best->rank) {
        return UnimplementedError(input + ": " + t.key + " has several pieces in " +
                                  index.files[c.file].path + ": fc does not know which is "
                                  "the module entry ds_to_universal writes as zero/" + name +
                                  "/fp32.pt");
      }
      if (!best || r < best->rank) best = Pick{r, &t, &c};
    }
    if (other_file || !best) continue;
    if (best->chunk->flat_range) {
      return UnimplementedError(input + ": " + t.key + " is stored as a flattened range, not a "
                                "module state dict entry");
    }
    auto [it, fresh] = picks.try_emplace(name, *best);
    if (fresh) {
      order.push_back(name);
    } else if (best->rank < it->second.rank) {
      it->second = *best;
    }
  }
  for (const std::string& name : order) {
    FC_RETURN_IF_ERROR(CheckParamName(input, name));
    const Pick& pick = picks.at(name);
    SourcePiece piece;
    piece.source = pick.entry;
    piece.src_box = pick.chunk->box;
    piece.dst_box = Box::Whole(pick.chunk->box.local_shape);
    if (pick.entry->dtype != DType::kFloat32) {
      piece.ops.push_back(PieceOp{PieceOp::Kind::kCast, {}, DType::kFloat32, {}});
    }
    std::vector<SourcePiece> pieces;
    pieces.push_back(std::move(piece));
    FC_RETURN_IF_ERROR(add_pieces("zero/" + name + "/fp32.pt", pick.entry->key, DType::kFloat32,
                                  pick.chunk->box.local_shape, std::move(pieces),
                                  UcpFileMeta{}));
  }
  return Status::Ok();
}

// The params written and what goes beside them: a DeepSpeed source's (ReadUcpSource), or
// another source's found by their Adam names (or all, --ucp-fresh-optimizer; mapped by
// --aoa) with the model states synthesized.
Status ChooseParams(const ConvertOptions& options, UcpJob& job) {
  const CheckpointIndex& index = job.index;
  if (index.format == CheckpointFormat::kDeepSpeed) {
    if (options.ucp_zero3) {
      return InvalidArgumentError(options.input + ": --ucp-zero3 applies to sources DeepSpeed "
                                  "did not write: a DeepSpeed source's UCP takes its form from "
                                  "the source's ZeRO stage");
    }
    if (options.ucp_fresh_optimizer) {
      return InvalidArgumentError(options.input + ": --ucp-fresh-optimizer applies to sources "
                                  "DeepSpeed did not write: this one's optimizer states are "
                                  "carried over");
    }
    if (options.ucp_step) {
      return InvalidArgumentError(options.input + ": --ucp-step applies to sources that store "
                                  "no Adam step: DeepSpeed's optimizer files hold it");
    }
    if (!options.aoa_file.empty()) {
      // DeepSpeed's universal loader takes the 16-bit module weights from the model states
      // files, copied as they are: renamed or reshaped params would not match them.
      return InvalidArgumentError(options.input + ": --aoa applies to sources DeepSpeed did "
                                  "not write: a DeepSpeed source's UCP keeps its model states "
                                  "files, which name the source's params");
    }
    FC_ASSIGN_OR_RETURN(job.params, UcpParams(index, options));
    std::vector<std::string> names;
    for (const UcpParam& p : job.params) names.push_back(p.name);
    for (const std::string& n : names) FC_RETURN_IF_ERROR(CheckParamName(options.input, n));
    FC_ASSIGN_OR_RETURN(job.source, ReadUcpSource(options.input, index, names));
    FC_ASSIGN_OR_RETURN(job.int_step, IntStep(index));
  } else {
    std::vector<const TensorEntry*> steps;
    std::optional<int64_t> group_step;
    if (const std::string s = index.Attribute("megatron.optimizer_step"); !s.empty()) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || end != s.data() + s.size()) {
        return UnimplementedError(options.input + ": the param groups' Adam steps differ (" + s +
                                  "): a Universal Checkpoint written by fc has one param "
                                  "group, whose params share one step");
      }
      group_step = v;
    }
    if (options.ucp_step && (group_step || options.ucp_fresh_optimizer)) {
      return InvalidArgumentError(
          options.input + ": --ucp-step applies to sources that store no Adam step" +
          (group_step ? ": this one's param groups hold step " + std::to_string(*group_step) +
                            " (megatron.optimizer_step)"
                      : std::string(" (a fresh optimizer starts at step 0)")));
    }
    if (options.ucp_fresh_optimizer) {
      FC_ASSIGN_OR_RETURN(job.params, FreshUcpParams(index, options.input, &job.unused));
    } else {
      FC_ASSIGN_OR_RETURN(job.params,
                          NamedUcpParams(index, options.input,
                                         group_step.has_value() || options.ucp_step.has_value(),
                                         &steps, &job.unused));
    }
    if (options.ucp_step && !steps.empty()) {
      return InvalidArgumentError(options.input + ": --ucp-step applies to sources that store no "
                                  "Adam step: this one has step tensors (" + steps.front()->key +
                                  ")");
    }
    if (!options.aoa_file.empty()) {
      FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(options.aoa_file, 64 << 20));
      FC_ASSIGN_OR_RETURN(job.params,
                          MapUcpParams(job.params,
                                       std::string(reinterpret_cast<const char*>(text.data()),
                                                   text.size()),
                                       options.aoa_file));
    }
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const UcpParam& p : job.params) {
      FC_RETURN_IF_ERROR(CheckParamName(options.input, p.name));
      shapes.emplace_back(p.name, p.mapped.empty() ? p.states[0].front()->global_shape
                                                   : p.mapped[0].shape);
    }
    FC_ASSIGN_OR_RETURN(int64_t step, CommonStep(index, steps));
    if (group_step) {
      if (!steps.empty() && step != *group_step) {
        return UnimplementedError(options.input + ": the step tensors say " +
                                  std::to_string(step) + ", the param groups " +
                                  std::to_string(*group_step));
      }
      step = *group_step;
    }
    if (options.ucp_step) step = *options.ucp_step;
    FC_ASSIGN_OR_RETURN(job.source, SynthesizedUcpSource(shapes, step, options.ucp_zero3));
    // DeepSpeed's FusedAdam and CPUAdam keep the step as a Python int (the ZeRO-3 form keeps
    // it in optimizer_state.pt).
    if (!options.ucp_zero3) job.int_step = step;
  }
  return Status::Ok();
}

// `options` as PlannedWith gives them; `processes` and `visibility` as PlanRequest's.
Status BuildJob(const ConvertOptions& options, int processes,
                std::vector<std::vector<int>> visibility, UcpJob& job) {
  const CheckpointIndex& index = job.index;
  FC_RETURN_IF_ERROR(ChooseParams(options, job));
  const bool zero3 = index.Attribute("deepspeed.optimizer") == "zero3" || options.ucp_zero3;
  PlanRequest request;
  request.kind = PlanKind::kExport;
  // One file of one tensor, filled by `pieces`.
  auto add_pieces = [&](const std::string& path, const std::string& key, DType dtype,
                        const Shape& shape, std::vector<SourcePiece> pieces,
                        UcpFileMeta meta) -> Status {
    const bool step_file = path.ends_with("/step.pt");
    const uint32_t t = static_cast<uint32_t>(request.tensors.size());
    FC_RETURN_IF_ERROR(PiecesCover(path, pieces, Box::Whole(shape)));
    request.tensors.push_back({key, dtype, shape, std::move(pieces)});
    PlanSlot slot{t, Box::Whole(shape), std::nullopt};
    UcpFileSpec spec{path, dtype, shape, std::move(meta)};
    if (spec.meta.form == UcpFileForm::kRawTensor && shape.size() != 1 && !step_file) {
      // The stage-3 form: the param flattened (row-major) into one dimension.
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      slot.flat_range = FlatRange{0, n};
      spec.shape = {n};
    }
    request.files.push_back({path, {slot}});
    job.specs.push_back(std::move(spec));
    return Status::Ok();
  };
  // One file of the program's output (--aoa), cast to fp32.
  auto add_mapped = [&](const std::string& path, const OutputTensor& out,
                        UcpFileMeta meta) -> Status {
    std::vector<SourcePiece> pieces = out.pieces;
    for (SourcePiece& piece : pieces) {
      if (piece.source == nullptr) continue;
      FC_RETURN_IF_ERROR(CheckSourceCoverage(*piece.source));
      if (PieceDType(piece) != DType::kFloat32) {
        piece.ops.push_back(PieceOp{PieceOp::Kind::kCast, {}, DType::kFloat32, {}});
      }
    }
    return add_pieces(path, out.name, DType::kFloat32, out.shape, std::move(pieces),
                      std::move(meta));
  };
  // One file of one tensor: the slices side by side along dim 0 (no slice: zeros of the
  // shape of the param's fp32 tensor, the last one added: --ucp-fresh-optimizer's moments).
  auto add = [&](const std::string& path, const std::vector<const TensorEntry*>& slices,
                 UcpFileMeta meta) -> Status {
    const bool step_file = path.ends_with("/step.pt");
    std::string key = path;
    Shape shape;
    DType dtype = DType::kFloat32;
    std::vector<SourcePiece> pieces;
    if (slices.empty()) {
      shape = request.tensors.back().shape;
      SourcePiece zeros;  // no source: filled with fill_value 0
      zeros.dst_box = Box::Whole(shape);
      pieces.push_back(std::move(zeros));
    } else {
      const TensorEntry& first = *slices.front();
      key = first.key;
      shape = first.global_shape;
      int64_t at = 0;
      for (const TensorEntry* src : slices) {
        FC_RETURN_IF_ERROR(CheckSourceCoverage(*src));
        const Shape& s = src->global_shape;
        if (slices.size() > 1 &&
            (s.empty() || s.size() != shape.size() ||
             !std::equal(s.begin() + 1, s.end(), shape.begin() + 1))) {
          return InvalidArgumentError(path + ": TP slices " + first.key + " " +
                                      Box::Whole(first.global_shape).ToString() + " and " +
                                      src->key + " " + Box::Whole(s).ToString() +
                                      " do not concatenate along dim 0");
        }
        SourcePiece piece;
        piece.source = src;
        piece.src_box = Box::Whole(s);
        piece.dst_box = piece.src_box;
        if (!s.empty()) {
          piece.dst_box.global_offset[0] = at;
          at += s[0];
        }
        pieces.push_back(std::move(piece));
      }
      if (!shape.empty()) shape[0] = at;
      // Master weights and Adam states are fp32 in a UCP (a DeepSpeed source's already are;
      // another source's 16-bit or fp64 tensors are cast).
      if (step_file) dtype = first.dtype;
      for (SourcePiece& piece : pieces) {
        if (piece.source->dtype != dtype) {
          piece.ops.push_back(PieceOp{PieceOp::Kind::kCast, {}, dtype, {}});
        }
      }
    }
    return add_pieces(path, key, dtype, shape, std::move(pieces), std::move(meta));
  };
  for (const UcpParam& p : job.params) {
    for (size_t s = 0; s < 3; ++s) {
      const std::string path = "zero/" + p.name + "/" + kStates[s] + ".pt";
      UcpFileMeta meta = job.source.meta.at(p.name + "/" + kStates[s]);
      FC_RETURN_IF_ERROR(s < p.mapped.size() ? add_mapped(path, p.mapped[s], std::move(meta))
                                             : add(path, p.states[s], std::move(meta)));
    }
    if (zero3) continue;  // the stage-3 form has no step.pt
    if (p.step != nullptr) {
      UcpFileMeta raw;
      raw.form = UcpFileForm::kRawTensor;
      FC_RETURN_IF_ERROR(add("zero/" + p.name + "/step.pt", {p.step}, std::move(raw)));
    } else if (job.int_step) {
      job.int_steps.push_back("zero/" + p.name + "/step.pt");
    }
  }
  if (index.format == CheckpointFormat::kDeepSpeed && !zero3) {
    FC_RETURN_IF_ERROR(AddModuleOnlyFiles(options.input, index, job.params, add_pieces));
  }
  request.processes = processes;
  SetWorkerResources(options, request);
  request.source_visibility = std::move(visibility);
  FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, index));
  FC_ASSIGN_OR_RETURN(job.plan, BuildPlan(std::move(request)));
  return Status::Ok();
}

void PrintPlan(const UcpJob& job, const ConvertOptions& options, std::ostream& out) {
  if (options.json) {
    out << PlanJson(job.plan, job.index, false) << "\n";
    return;
  }
  const Plan& plan = job.plan;
  out << "ucp plan: " << job.params.size() << " param(s) into " << plan.files.size()
      << " tensor file(s), read " << HumanBytes(plan.bytes_needed) << ", write "
      << HumanBytes(plan.bytes_written) << ", " << plan.threads << " thread(s)\n";
  if (!options.aoa_file.empty()) {
    out << "params and their moments as AOA program " << options.aoa_file << " maps them\n";
  }
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", estimated peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum) << "\n";
  out << "also: zero/optimizer_state.pt ("
      << (!job.source.model_states_archive.empty()
              ? (job.int_step ? "ds_version and no param groups"
                              : "the step and one empty param group")
          : job.source.optimizer_state_copy.empty() ? "from rank 0's optimizer state"
                                                    : "copied")
      << "), " << job.int_steps.size() << " int step file(s), ";
  if (!job.source.model_states_archive.empty()) {
    out << job.source.model_states_name << " (written: the source is not DeepSpeed's)\n";
    if (!job.unused.empty()) {
      out << "left out (" << (options.ucp_fresh_optimizer ? "not floating point" : "no Adam state")
          << "): " << job.unused.size()
          << " tensor(s): " << FirstNames(job.unused) << "\n";
    }
    return;
  }
  out << "copied from " << job.source.dir << ": "
      << (job.source.copy_files.empty() ? std::string("nothing")
                                        : FirstNames(job.source.copy_files))
      << "\n";
}

// <parent>/latest_universal, replaced atomically (a temporary file renamed onto it).
Status WriteLatestUniversal(const std::string& output_dir) {
  const std::string out = StripTrailingSlashes(output_dir);
  std::string parent = Dirname(out);
  if (parent.empty()) parent = ".";
  const std::string tmp =
      JoinPath(parent, "latest_universal.fc-tmp-" + std::to_string(::getpid()));
  Status s = WriteSmallFile(tmp, Basename(out));
  if (s.ok()) s = RenameDurably(tmp, JoinPath(parent, "latest_universal"));
  if (!s.ok()) (void)RemoveAll(tmp);
  return s.With("latest_universal");
}


// The files beside the param files (process 0, once every part finished): the int step
// files, zero/optimizer_state.pt, the copied or written model states.
Status WriteSideFiles(const UcpJob& job, const std::string& staging) {
  if (job.int_step) {
    PickleValue v;
    v.kind = PickleValue::Kind::kInt;
    v.int_value = *job.int_step;
    FC_ASSIGN_OR_RETURN(std::string archive, PlainValueArchive(v));
    for (const std::string& path : job.int_steps) {
      FC_RETURN_IF_ERROR(WriteSmallFile(JoinPath(staging, path), archive));
    }
  }
  FC_RETURN_IF_ERROR(CreateDirectories(JoinPath(staging, "zero")));
  const std::string osd = JoinPath(staging, "zero/optimizer_state.pt");
  if (!job.source.optimizer_state_copy.empty()) {
    FC_RETURN_IF_ERROR(CopyFileInBlocks(job.source.optimizer_state_copy, osd, kCopyBlock));
  } else if (!job.source.optimizer_state_archive.empty()) {
    FC_RETURN_IF_ERROR(WriteSmallFile(osd, job.source.optimizer_state_archive));
  }
  for (const std::string& name : job.source.copy_files) {
    FC_RETURN_IF_ERROR(CopyFileInBlocks(JoinPath(job.source.dir, name),
                                        JoinPath(staging, name), kCopyBlock));
  }
  if (!job.source.model_states_archive.empty()) {
    FC_RETURN_IF_ERROR(WriteSmallFile(JoinPath(staging, job.source.model_states_name),
                                      job.source.model_states_archive));
  }
  return Status::Ok();
}

// One process's param files: a UcpWriter of the plan files assigned to it.
class UcpPart : public JobPart {
 public:
  UcpPart(std::unique_ptr<UcpWriter> writer, std::map<uint32_t, size_t> local)
      : writer_(std::move(writer)), local_(std::move(local)) {}
  Status Write(uint32_t file, uint32_t, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    auto it = local_.find(file);
    if (it == local_.end()) {
      return InternalError("UCP plan file " + std::to_string(file) + " is not this process's");
    }
    return writer_->Write(it->second, byte_offset, bytes);
  }
  Result<std::string> Finish() override {
    FC_RETURN_IF_ERROR(writer_->Finish());
    return std::string();
  }

 private:
  std::unique_ptr<UcpWriter> writer_;
  const std::map<uint32_t, size_t> local_;  // plan file -> the writer's file
};

class UcpOutputJob : public OutputJob {
 public:
  explicit UcpOutputJob(const ConvertOptions& options) : options_(options) {}
  UcpJob& job() { return job_; }

  const Plan& plan() const override { return job_.plan; }
  const CheckpointIndex& source() const override { return job_.index; }
  void PrintPlan(std::ostream& out) const override { fc::PrintPlan(job_, options_, out); }
  Result<std::unique_ptr<JobPart>> CreatePart(const std::string& staging,
                                              const std::vector<uint32_t>& files,
                                              int /*process*/) const override {
    if (files.empty()) return std::unique_ptr<JobPart>();
    std::vector<UcpFileSpec> specs;
    std::map<uint32_t, size_t> local;
    for (uint32_t f : files) {
      local[f] = specs.size();
      specs.push_back(job_.specs[f]);
    }
    FC_ASSIGN_OR_RETURN(std::unique_ptr<UcpWriter> writer,
                        UcpWriter::Create(staging, std::move(specs)));
    return std::unique_ptr<JobPart>(std::make_unique<UcpPart>(std::move(writer),
                                                              std::move(local)));
  }
  // Then, once OUT is committed, <parent of OUT>/latest_universal.
  Status Commit(JobPart*, std::span<const std::string>, OutputDir& output,
                const std::string& staging) const override {
    FC_RETURN_IF_ERROR(WriteSideFiles(job_, staging));
    FC_RETURN_IF_ERROR(output.Commit());
    return WriteLatestUniversal(options_.output_dir);
  }

 private:
  ConvertOptions options_;
  UcpJob job_;
};

}  // namespace

Result<ConvertJob> PlanUcp(const ConvertOptions& options, const OutputFormat*,
                           CheckpointIndex index, SharedInput& input, Communicator& comm) {
  auto out = std::make_unique<UcpOutputJob>(options);
  UcpJob& job = out->job();
  job.index = std::move(index);
  FC_ASSIGN_OR_RETURN(std::vector<std::vector<int>> visibility,
                      ShareVisibility(job.index, input, comm));
  FC_RETURN_IF_ERROR(comm.AllOk(
      BuildJob(PlannedWith(options, comm), comm.size(), std::move(visibility), job)));
  ConvertSummary summary;
  summary.ranks = 0;
  // chunks: the files fc writes; objects: those it copies.
  const UcpSource& src = job.source;
  summary.chunks = job.specs.size() + job.int_steps.size() +
                   (src.optimizer_state_copy.empty() ? 1 : 0) +
                   (src.model_states_archive.empty() ? 0 : 1);
  summary.bytes_written = job.plan.bytes_written;
  summary.objects = src.copy_files.size() + (src.optimizer_state_copy.empty() ? 0 : 1);
  return ConvertJob{std::move(out), summary};
}

}  // namespace fc
