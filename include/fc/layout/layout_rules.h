// Layout rules: parallel degrees plus naming rules that say how each tensor of a model is cut
// across the ranks of a TP x sharding x DP x PP world (with EP carved out of the
// data-parallel ranks), and which optimizer states are flattened and split ZeRO-1 style.
// `--target-layout FILE.json` and `--preset NAME` of fc-convert; man/fc-layout.5 is the
// user-facing spec (JSON schema, a complete example, the presets).
//
// RANK NUMBERING (Megatron order: tp fastest, then sharding, then dp, then pp):
//   world = tp * sharding * dp * pp
//   rank  = tp_rank + tp * (sharding_rank + sharding * (dp_rank + dp * pp_rank))
//   ep_rank = (sharding_rank + sharding * dp_rank) mod ep     (ep must divide sharding * dp)
// Expert parallelism reuses the data-parallel ranks, as Megatron's "tp-cp-ep-dp-pp" order
// does: ep_rank varies fastest among the sharding x dp ranks.
//
// WHAT A RANK HOLDS. Every tensor is placed by the rules matched against its parameter
// name: for a ZeRO state (a key matched by a `zero.states` regex) that is capture group 1
// of the regex, otherwise the key itself. All regexes are RE2 syntax (linear-time matching;
// no backreferences or lookaround; at most 4096 bytes and 8 MiB compiled each), searched
// (not anchored: use ^ and $ to anchor); in each list the first matching rule wins.
//   - Tensor parallelism: the first `tensor_parallel` rule that matches splits `axis` into
//     tp contiguous blocks, block i going to tp_rank i. A tensor no rule matches is
//     replicated over the TP group (every tp_rank holds the whole tensor).
//     Uneven axes (extent % tp != 0) follow the rule's `uneven` (else LayoutRules::uneven):
//       kError    (default): an error suggesting the AOA vocabulary-padding recipe;
//       kChunk    torch.chunk: every block has ceil(n/tp) elements, the last ones fewer or
//                 none (n=10, tp=4: 3,3,3,1; n=5, tp=4: 2,2,1,0);
//       kBalanced the first n%tp blocks get one more (n=10, tp=4: 3,3,2,2).
//   - Pipeline (only consulted when pp > 1, and then required): a tensor whose name matches
//     `layer_regex` (capture group 1 = decimal layer index) belongs to the stage of that
//     layer: layers_per_stage[s] consecutive layers per stage, or num_layers / pp each
//     (num_layers defaults to the largest index seen + 1; it must then divide evenly).
//     Otherwise `first_stage` / `last_stage` regexes put it on stage 0 / pp-1 (both: on
//     both stages, e.g. tied embeddings); otherwise `other` decides (default: error).
//   - Experts: a tensor whose name matches `experts.regex` (capture group 1 = decimal
//     expert index e) belongs to ep_rank e / (num_experts / ep) only (contiguous blocks of
//     experts; num_experts defaults to the largest index seen + 1 and must be divisible by
//     ep). Other tensors are held by every ep_rank. Expert tensors are TP-split by the same
//     tensor_parallel rules.
//   - Storage: the ranks holding the same block of a tensor are its copies. The copy on the
//     lowest rank is stored with replica_id 0; the others are stored (replica_id 1, 2, ...
//     in rank order) only when the key matches a `per_rank_replicas` regex.
//
// ZERO-1 FLATTENING (the `zero` rules; exactly):
//   1. The states of one parameter (keys matched by `zero.states`, grouped by capture
//      group 1) must all have the same shape; each is placed like its parameter (above).
//   2. Parameters are ordered by their first appearance in the tensor list (the parameter's
//      own key or any of its states); `order: kReverse` reverses that order.
//   3. A bucket is one flat buffer: for each (pp stage, tp_rank, dp_rank), one bucket of
//      the non-expert parameters of that stage, shared by the `sharding` ranks; and (when
//      expert rules exist) one bucket per ep_rank of the expert parameters, shared by the
//      sharding ranks with that ep_rank (Megatron keeps expert parameters in their own
//      buffers too). The members of a bucket are ordered by sharding_rank.
//   4. In a bucket, each parameter's rank-local block (its TP block, element count n) gets
//      the flat range [offset, offset + n): offset = the previous parameter's end rounded
//      up to a multiple of `align` (elements; the first parameter starts at 0). total = the
//      last parameter's end. Every state of the parameter uses the same offsets.
//   5. The buffer is cut into M (members) ranges of part = ceil(total / M) elements, rounded
//      up to a multiple of `partition_align`: member j owns [j*part, (j+1)*part) cut to
//      [0, total) (so the last members may own less or nothing).
//   6. Member j stores, for each state of each parameter in the bucket whose range meets
//      its own, one chunk: box = the parameter's TP block (global coordinates), flat_range
//      = the intersection shifted by -offset (a range of the block's row-major
//      flattening). flat_range is set even when it spans the whole block. Padding
//      (alignment gaps, the tail beyond total) is never stored.
//   7. The buckets of other dp_ranks (and, for a parameter held by two stages, of the
//      other stage; for a parameter that is not TP-split, of the other tp_ranks) are
//      copies of the first: replica_id 1, 2, ... as above.
//   8. A state with no elements is not flattened: it is stored whole, once, like a
//      replicated tensor.
//
// Thread-safety: plain values and pure functions.
#ifndef FC_LAYOUT_LAYOUT_RULES_H_
#define FC_LAYOUT_LAYOUT_RULES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"
#include "fc/layout/target_layout.h"

namespace fc {

struct ParallelDegrees {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;        // pure replication of everything (incl. the sharded states)
  int64_t sharding = 1;  // the ZeRO-1 group that splits the flattened states
  int64_t ep = 1;        // carved out of sharding x dp (see RANK NUMBERING)

  // tp * sharding * dp * pp. Precondition: ValidateDegrees passed.
  int64_t world_size() const { return tp * sharding * dp * pp; }
  friend bool operator==(const ParallelDegrees&, const ParallelDegrees&) = default;
};

// All degrees >= 1, world size <= 2^24, ep divides sharding * dp. Errors: kInvalidArgument
// ("degrees: ep=3 must divide sharding*dp=4").
Status ValidateDegrees(const ParallelDegrees& degrees);

// Where a rank sits in the grid (RANK NUMBERING above).
struct RankCoordinates {
  int64_t tp = 0;
  int64_t sharding = 0;
  int64_t dp = 0;
  int64_t pp = 0;
  int64_t ep = 0;
  friend bool operator==(const RankCoordinates&, const RankCoordinates&) = default;
};
// Preconditions: ValidateDegrees(degrees).ok(); 0 <= rank < world_size().
RankCoordinates RankCoordinatesOf(const ParallelDegrees& degrees, int64_t rank);
// The rank of (tp, sharding, dp, pp); the inverse of RankCoordinatesOf (ep is implied).
int64_t RankOf(const ParallelDegrees& degrees, int64_t tp, int64_t sharding, int64_t dp,
               int64_t pp);

enum class UnevenSplit { kError, kChunk, kBalanced };
// JSON names "error", "chunk", "balanced".
std::string_view UnevenSplitName(UnevenSplit mode);

// The extents of the `parts` blocks of an axis of extent `n` under `mode` (see above).
// Errors: kInvalidArgument when n % parts != 0 and mode is kError (the message names n and
// parts only; LayoutFromRules adds the tensor and the recipe hint).
Result<std::vector<int64_t>> SplitExtents(int64_t n, int64_t parts, UnevenSplit mode);

struct TensorParallelRule {
  std::string regex;
  int64_t axis = 0;                    // >= 0; must be < the tensor's rank
  std::optional<UnevenSplit> uneven;   // unset: LayoutRules::uneven
  friend bool operator==(const TensorParallelRule&, const TensorParallelRule&) = default;
};

enum class OtherStage { kError, kFirst, kLast, kAll };
// JSON names "error", "first", "last", "all".
std::string_view OtherStageName(OtherStage mode);

struct PipelineRules {
  std::string layer_regex;                 // capture group 1: the layer index
  std::optional<int64_t> num_layers;       // unset: largest index seen + 1
  std::vector<int64_t> layers_per_stage;   // empty: even split; else pp entries >= 0
  std::vector<std::string> first_stage;    // regexes
  std::vector<std::string> last_stage;     // regexes
  OtherStage other = OtherStage::kError;
  friend bool operator==(const PipelineRules&, const PipelineRules&) = default;
};

struct ExpertRules {
  std::string regex;                    // capture group 1: the expert index
  std::optional<int64_t> num_experts;   // unset: largest index seen + 1
  friend bool operator==(const ExpertRules&, const ExpertRules&) = default;
};

enum class ParamOrder { kTensors, kReverse };
// JSON names "tensors", "reverse".
std::string_view ParamOrderName(ParamOrder order);

struct ZeroRules {
  std::vector<std::string> states;   // regexes; capture group 1: the parameter name
  ParamOrder order = ParamOrder::kTensors;
  int64_t align = 1;                 // elements, 1 .. 2^32: parameter start offsets
  int64_t partition_align = 1;       // elements, 1 .. 2^32: per-rank range size
  friend bool operator==(const ZeroRules&, const ZeroRules&) = default;
};

struct LayoutRules {
  ParallelDegrees degrees;
  std::vector<TensorParallelRule> tensor_parallel;
  UnevenSplit uneven = UnevenSplit::kError;  // default for rules without their own
  std::optional<PipelineRules> pipeline;     // required when degrees.pp > 1
  std::optional<ExpertRules> experts;
  std::optional<ZeroRules> zero;
  std::vector<std::string> per_rank_replicas;  // regexes over keys
  friend bool operator==(const LayoutRules&, const LayoutRules&) = default;
};

// Checks degrees and every rule without looking at tensors: regexes compile (and the
// layer, expert and state regexes have a capture group), axes >= 0, alignments in
// [1, 2^32], layers_per_stage has pp entries >= 0 (and sums to num_layers when both are
// set), a pipeline section exists when pp > 1. Errors: kInvalidArgument naming the rule, e.g.
// "tensor_parallel[2].regex 'a(': <RE2 message>"; a pattern over 4096 bytes or one whose
// compiled form exceeds 8 MiB is refused the same way.
Status ValidateLayoutRules(const LayoutRules& rules);

// Parses a rules file (schema in man/fc-layout.5) and validates it (ValidateLayoutRules).
// Members: "degrees" {tp, pp, dp, sharding, ep} (absent ones are 1), "preset" (start from
// PresetRules(name, degrees); every other section present replaces the preset's section
// wholesale), "tensor_parallel", "uneven", "pipeline", "experts", "zero",
// "per_rank_replicas". Unknown members are errors (typos would silently change a layout).
// Errors: kInvalidArgument ("layout rules: pipeline.layers_per_stage: must be an array of
// non-negative integers", "layout rules: unknown member 'tensor_paralel'").
Result<LayoutRules> ParseLayoutRules(std::string_view json);

// The rules as JSON in ParseLayoutRules's schema (pretty-printed, every section written,
// no "preset"): ParseLayoutRules(LayoutRulesJson(r)) == r for valid rules. Shows what a
// preset expands to.
std::string LayoutRulesJson(const LayoutRules& rules);

// Built-in rules for common model families with the given degrees:
//   "megatron-gpt": Megatron-core GPT/Llama naming (decoder.layers.N.self_attention...,
//                   embedding.word_embeddings, output_layer), MoE experts
//                   (.experts.local_experts.N.);
//   "hf-llama":     HuggingFace Llama/Qwen/Mistral naming (model.layers.N.self_attn...,
//                   model.embed_tokens, lm_head), MoE experts (.experts.N.).
// The exact regexes are listed in man/fc-layout.5 (and by LayoutRulesJson). When
// degrees.sharding > 1 the presets also flatten the optimizer states under the names fc's
// readers give them: optimizer.[state.]{fp32,fp32_param,param,exp_avg,exp_avg_sq}.<p>, the
// suffixes .exp_avg, .exp_avg_sq, .fp32_param, and Paddle's .moment1_0, .moment2_0, .w_0
// (parameter order, align 1, partition_align 1).
// Errors: kInvalidArgument for an unknown name ("unknown preset 'x' (known: megatron-gpt,
// hf-llama)") or bad degrees.
Result<LayoutRules> PresetRules(std::string_view name, const ParallelDegrees& degrees);

// The preset names, for help texts.
std::vector<std::string_view> PresetNames();

// The target layout of `tensors` under `rules` (see the file comment for the exact
// semantics). Ranks 0 .. world_size-1 are all listed; a rank's chunks follow the order of
// `tensors`; a rank holds at most one chunk per tensor. `tensors` keep their order and
// dtypes. A tensor with no elements is stored as one chunk (its whole box) on the first
// rank that holds it; empty TP blocks of a non-empty tensor (uneven kChunk) get no chunk.
// The result always passes ValidateTargetLayout.
// Errors (kInvalidArgument, naming the tensor): ValidateLayoutRules failures; duplicate
// keys or bad shapes; "tensor 'k' (shape (10, 4)): tensor_parallel rule 're' axis 0
// (extent 10) is not divisible by tp=4; pad the axis ... (AOA vocabulary-padding recipe,
// fc-aoa(7)) or set \"uneven\" ..."; "tensor 'k' (shape (4,)): tensor_parallel rule 're'
// axis 2 is out of range for a 1-d tensor";
// a tensor no pipeline rule places when pp > 1; layer or expert indices beyond the
// declared counts, counts that do not divide; ZeRO states of one parameter with different
// shapes. kOutOfRange when a ZeRO buffer would exceed 2^63 elements.
Result<TargetLayout> LayoutFromRules(const LayoutRules& rules,
                                     std::span<const TargetTensor> tensors);

// Whether rules fit a model, for a layout LayoutFromRules made from them (`layout`) and the
// tensors it was made of. The rules do not fit when they have patterns (tensor_parallel,
// pipeline layer_regex / first_stage / last_stage, experts regex) and none of them finds any
// tensor key (rules for another model family), also with one rank (all degrees 1: a merge
// with rules for another model is refused rather than done silently), or when a rank of
// `layout` holds no chunk. Rules without any pattern (degrees only) fit every model.
// Errors: kInvalidArgument "the rules match no tensor (first unmatched key 'K')" or "target
// rank R (tp T, pp P, dp D, sharding S) holds no tensor" (+ "; first key no rule matches:
// 'K'" when there is one); the caller adds which rules (the preset or the file).
Status CheckRulesFit(const LayoutRules& rules, std::span<const TargetTensor> tensors,
                     const TargetLayout& layout);

// The axis along which `rules` split tensor `name` over the TP ranks: that of the first
// tensor_parallel rule whose regex finds `name`, or nullopt (no rule: replicated). For readers
// told how a source checkpoint was split (--source-layout). The function shares the compiled
// regexes; it is safe to call from any thread.
// Errors: ValidateLayoutRules failures.
Result<std::function<std::optional<int64_t>(std::string_view name)>> TensorParallelAxisOf(
    const LayoutRules& rules);

}  // namespace fc

#endif  // FC_LAYOUT_LAYOUT_RULES_H_
