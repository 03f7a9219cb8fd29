// The distributed optimizer's states in distrib_optim.pt (reader.h): each rank's buffers
// mapped onto its params by the layout Megatron gave them (distrib_optim_layout.h), tried
// over the candidate rules and confirmed on the data (master_check.h).
#include <algorithm>
#include <numeric>
#include <set>

#include "fc/core/checked_math.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"
#include "src/format/megatron/master_check.h"
#include "src/format/megatron/optimizer_states.h"
#include "src/format/megatron/reader.h"

namespace fc::megatron_internal {
namespace {

using json_internal::ShapeText;

std::string RuleText(const BufferLayoutRule& r) {
  return "params aligned to " + std::to_string(r.param_alignment) + " elements, " +
         (r.bucket_size ? "buckets of " + std::to_string(*r.bucket_size) + " elements"
                        : std::string("one bucket")) +
         (r.shared_start_dp > 0 ? ", shared embedding padded for dp " +
                                      std::to_string(r.shared_start_dp) + " (Megatron-Core < 0.13.1)"
                                : std::string()) +
         (r.shared_own_bucket ? "" : ", no bucket of its own for a shared embedding");
}

// The form (distrib_optim_layout.h): coalesced (Megatron-Core since February 2024),
// per-bucket lists (Megatron-Core 0.4 and 0.5, "per_bucket_numel"), or one padded tensor
// per state (Megatron-LM before buckets: int keys only).
enum class Form { kCoalesced, kPerBucket, kWhole };

Result<Form> StateForm(const PV& root, const std::string& rel) {
  if (PickleBool(root.Find("buckets_coalesced")).value_or(false)) return Form::kCoalesced;
  if (root.Find("per_bucket_numel") != nullptr) return Form::kPerBucket;
  for (const auto& [k, v] : *PickleDictEntries(&root)) {
    if (!k || !k->is_int()) {
      return UnimplementedError(rel + ": key " + (k ? k->DebugString() : std::string("?")) +
                                " and neither 'buckets_coalesced' nor 'per_bucket_numel': a "
                                "form of the distributed optimizer's state fc does not know");
    }
  }
  return Form::kWhole;
}

// What the layout attribute says of the form.
const char* FormText(Form form) {
  return form == Form::kCoalesced ? ""
         : form == Form::kPerBucket
             ? "per-bucket tensors (Megatron-Core 0.4-0.5), "
             : "one padded buffer per state (Megatron-LM before buckets), ";
}

// A buffer of the rank: a model chunk's params of one dtype.
struct Buffer {
  int64_t v = 0;
  DType dtype = DType::kFloat32;
  std::vector<const Piece*> params;
  std::vector<Located> located;
};

// The rank's buffers: each model chunk's params grouped by dtype (first seen first); the
// dense or the expert params, of every chunk or of chunk `chunk` only.
Result<std::vector<Buffer>> RankBuffers(const RankFile& model, const Reader::Pieces& pieces,
                                        int64_t p, int64_t e, int64_t t, int64_t vpp,
                                        bool experts, std::optional<int64_t> chunk) {
  std::vector<Buffer> buffers;
  for (int64_t v = 0; v < vpp; ++v) {
    if (chunk && v != *chunk) continue;
    const size_t first = buffers.size();
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      if (IsExpertPiece(pc) != experts) continue;
      FC_ASSIGN_OR_RETURN(Located l, model.Locate(*pc.value, "'" + pc.name + "'"));
      size_t b = first;
      while (b < buffers.size() && buffers[b].dtype != l.dtype) ++b;
      if (b == buffers.size()) buffers.push_back(Buffer{v, l.dtype, {}, {}});
      buffers[b].params.push_back(&pc);
      buffers[b].located.push_back(std::move(l));
    }
  }
  return buffers;
}

// One buffer as saved: its state tensors and what they are checked against.
struct SavedBuffer {
  Form form = Form::kWhole;
  std::string where;                // "<file> buffer <g>", for messages
  const RankFile* f = nullptr;      // distrib_optim.pt
  const RankFile* model = nullptr;  // model_optim_rng.pt
  const Buffer* b = nullptr;
  // Per state, its tensors: one per bucket in the per-bucket form, else one.
  std::array<std::vector<Located>, 3> flat;
  std::optional<int64_t> numel;  // the coalesced form's length
  // The per-bucket form's own record of the padded bucket sizes (a cross-check).
  std::optional<std::vector<int64_t>> recorded_buckets;
  std::vector<BufferParam> params;  // b's params, in order
  int64_t max_padding = 0;  // the older forms pad each saved tensor by less than this
};

// The state tensors of buffer `g` (`states`: its {param, exp_avg, exp_avg_sq}): fills s->flat.
Status LoadStateTensors(const PV& states, size_t g, SavedBuffer* s) {
  const Form form = s->form;
  const std::string& where = s->where;
  const std::optional<int64_t>& numel = s->numel;
  const RankFile& f = *s->f;
  auto& flat = s->flat;
  for (size_t r = 0; r < 3; ++r) {
    const PV* value = states.Find(kOptimKeys[r]);
    std::vector<const PV*> tensors;
    if (form == Form::kPerBucket && value != nullptr && value->is_list()) {
      for (const auto& item : value->items) tensors.push_back(item.get());
    } else if (form != Form::kPerBucket) {
      tensors.push_back(value);
    }
    if (tensors.empty()) {
      return DataLossError(where + ": no '" + std::string(kOptimKeys[r]) + "' " +
                           (form == Form::kPerBucket ? "list of bucket tensors" : "tensor"));
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      const std::string what = "buffer " + std::to_string(g) + " '" +
                               std::string(kOptimKeys[r]) + "'" +
                               (form == Form::kPerBucket ? " bucket " + std::to_string(k) : "");
      if (tensors[k] == nullptr || !LooksLikeTensor(*tensors[k])) {
        return DataLossError(where + ": no tensor for " + what);
      }
      FC_ASSIGN_OR_RETURN(Located l, f.Locate(*tensors[k], what));
      if (l.dtype != DType::kFloat32 || l.shape.size() != 1 || !l.contiguous ||
          (numel && l.shape[0] != *numel)) {
        return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                             ShapeText(l.shape) + ", expected contiguous float32 [" +
                             (numel ? std::to_string(*numel) + "] (numel_unpadded)" : "n]"));
      }
      flat[r].push_back(std::move(l));
    }
    if (flat[r].size() != flat[0].size()) {
      return DataLossError(where + ": " + std::to_string(flat[0].size()) + " '" +
                           std::string(kOptimKeys[0]) + "' bucket tensors but " +
                           std::to_string(flat[r].size()) + " '" + std::string(kOptimKeys[r]) +
                           "'");
    }
    for (size_t k = 0; k < flat[r].size(); ++k) {
      if (flat[r][k].shape != flat[0][k].shape) {
        return DataLossError(flat[r][k].where + " is " + ShapeText(flat[r][k].shape) + ", " +
                             flat[0][k].where + " " + ShapeText(flat[0][k].shape));
      }
    }
  }
  return Status::Ok();
}

// The per-bucket form's record of buffer `g`'s padded bucket sizes, when it has the shape
// Megatron gave it (a list over buffers of {dtype: [numel per bucket]}).
std::optional<std::vector<int64_t>> RecordedBuckets(const PV& per_bucket_numel, size_t g,
                                                    size_t buffers) {
  std::optional<std::vector<int64_t>> recorded_buckets;
  if (per_bucket_numel.is_list() && per_bucket_numel.items.size() == buffers &&
      per_bucket_numel.items[g]) {
    const Entries* e = PickleDictEntries(per_bucket_numel.items[g].get());
    if (e != nullptr && e->size() == 1 && (*e)[0].second && (*e)[0].second->is_list()) {
      std::vector<int64_t> sizes;
      for (const auto& item : (*e)[0].second->items) {
        const std::optional<int64_t> n = PickleInt(item.get());
        if (!n) break;
        sizes.push_back(*n);
      }
      if (sizes.size() == (*e)[0].second->items.size()) recorded_buckets = std::move(sizes);
    }
  }
  return recorded_buckets;
}

// Buffer `g` of the rank (`b`) as `root` holds it: its {dtype: states} entry checked
// against the buffer's dtype, then its state tensors.
Result<SavedBuffer> LoadSavedBuffer(const RankFile& f, const RankFile& model, const PV& state,
                                    Form form, const std::vector<Buffer>& buffers, size_t g,
                                    const std::string& rel, bool shared_embeddings,
                                    int64_t max_padding) {
  const Buffer& b = buffers[g];
  SavedBuffer s;
  s.form = form;
  s.where = rel + " buffer " + std::to_string(g);
  s.f = &f;
  s.model = &model;
  s.b = &b;
  s.max_padding = max_padding;
  const std::string& where = s.where;
  const PV* root = &state;
  const PV* by_dtype = PickleFindIntKey(root, static_cast<int64_t>(g));
  const Entries* entries = PickleDictEntries(by_dtype);
  if (entries == nullptr || entries->size() != 1 || !(*entries)[0].first ||
      !(*entries)[0].second) {
    return DataLossError(where + ": expected {dtype: states}, found " +
                         (by_dtype ? by_dtype->DebugString() : std::string("nothing")));
  }
  // The key: (param dtype, grad dtype), or (older) the grad dtype alone.
  const PV& dkey = *(*entries)[0].first;
  const PV* param_dtype = dkey.is_tuple() && dkey.items.size() == 2 ? dkey.items[0].get() : nullptr;
  if (param_dtype != nullptr && TorchDTypeOf(param_dtype) != b.dtype) {
    return DataLossError(where + " is for " + dkey.DebugString() + " params, the model chunk's are " +
                         std::string(DTypeName(b.dtype)));
  }
  if (param_dtype == nullptr && !TorchDTypeOf(&dkey)) {
    return DataLossError(where + ": unexpected key " + dkey.DebugString());
  }
  const PV& states = *(*entries)[0].second;
  if (form == Form::kCoalesced) {
    s.numel = PickleInt(states.Find("numel_unpadded"));
    if (!s.numel || *s.numel < 0) return DataLossError(where + ": no numel_unpadded");
  }
  FC_RETURN_IF_ERROR(LoadStateTensors(states, g, &s));
  if (form == Form::kPerBucket) {
    s.recorded_buckets = RecordedBuckets(*root->Find("per_bucket_numel"), g, buffers.size());
  }
  for (size_t i = 0; i < b.params.size(); ++i) {
    const std::string& n = b.params[i]->name;
    FC_ASSIGN_OR_RETURN(const int64_t count, CheckedNumElements(b.located[i].shape));
    s.params.push_back(BufferParam{count, shared_embeddings && IsEmbeddingOrOutput(n)});
  }
  return s;
}

// Those versions of the per-bucket form had no shared-embedding start padding; a shared
// embedding's bucket of its own came at some point in them: both are tried.
std::vector<BufferLayoutRule> PerBucketRules(const std::vector<BufferLayoutRule>& rules,
                                             bool shared_embeddings) {
  std::vector<BufferLayoutRule> older;
  for (const BufferLayoutRule& r : rules) {
    if (r.shared_start_dp > 0) continue;
    older.push_back(r);
    if (shared_embeddings) {
      older.push_back(r);
      older.back().shared_own_bucket = false;
    }
  }
  return older;
}

// A layout that fits: over the params `kept` (indices into b.params, in order), the
// others frozen (not in the buffer: Megatron leaves out params without requires_grad).
struct Fit {
  CoalescedLayout layout;
  std::vector<size_t> kept;
};

// Param j of a layout in the saved tensors: which one, and where.
std::pair<size_t, int64_t> Place(Form form, const CoalescedLayout& l, size_t j) {
  return form == Form::kPerBucket
             ? std::pair<size_t, int64_t>(static_cast<size_t>(l.bucket_of[j]), BucketOffset(l, j))
             : std::pair<size_t, int64_t>(0, l.offsets[j]);
}

bool SamePlaces(Form form, const Fit& a, const Fit& c) {
  return a.kept == c.kept && a.layout.offsets == c.layout.offsets &&
         (form != Form::kPerBucket || a.layout.bucket_of == c.layout.bucket_of);
}

// Whether param i's master weight at `where` rounds to its model weight (inside the saved
// tensor).
Status CheckPlace(const SavedBuffer& s, size_t i, std::pair<size_t, int64_t> where) {
  const auto& flat = s.flat;
  const Buffer& b = *s.b;
  if (where.first >= flat[0].size() || where.second < 0 ||
      where.second > flat[0][where.first].shape[0] - s.params[i].numel) {
    return DataLossError("'" + b.params[i]->name + "' would lie past the end of the " +
                         "saved " + std::string(kOptimKeys[0]) + " tensor " +
                         std::to_string(where.first));
  }
  Located master = flat[0][where.first];
  master.first += static_cast<uint64_t>(where.second) * 4;
  return CheckMasterRoundsToModel(*s.f->file, master, *s.model->file, b.located[i],
                                  b.params[i]->name);
}

// The sizes a fitting layout makes against the saved tensors' sizes.
Status CheckBucketSizes(const SavedBuffer& s, const Fit& fit) {
  const auto& flat = s.flat;
  if (s.form == Form::kCoalesced && fit.layout.numel_unpadded != *s.numel) {
    return DataLossError("makes " + std::to_string(fit.layout.numel_unpadded) +
                         " elements, the file has " + std::to_string(*s.numel));
  }
  if (s.form == Form::kPerBucket && static_cast<size_t>(fit.layout.buckets) != flat[0].size()) {
    return DataLossError("makes " + std::to_string(fit.layout.buckets) +
                         " buckets, the file has " + std::to_string(flat[0].size()));
  }
  if (s.form != Form::kCoalesced) {
    // Each saved tensor: its bucket (the whole buffer: one bucket), padded by less than
    // the data-parallel size, and the size the file records.
    for (size_t k = 0; k < flat[0].size(); ++k) {
      const int64_t have = flat[0][k].shape[0];
      const int64_t want = fit.layout.bucket_numel_unpadded[k];
      if (have < want || have - want >= s.max_padding) {
        return DataLossError("makes bucket " + std::to_string(k) + " " + std::to_string(want) +
                             " elements, the file's tensor has " + std::to_string(have));
      } else if (s.recorded_buckets && (s.recorded_buckets->size() != flat[0].size() ||
                                        (*s.recorded_buckets)[k] != have)) {
        return DataLossError("per_bucket_numel does not match the bucket tensors' sizes");
      }
    }
  }
  return Status::Ok();
}

// Fits `rule` to the saved buffer: nullopt when it fits (`*out` holds the fit), else why
// not. An error: the layout cannot be computed.
//
// The params are checked in buffer order (the reverse of theirs). Where one's place holds
// other values, it is taken for frozen when a later param (in buffer order) holds them:
// that one and the params between are left out, the layout computed again without them,
// and the walk goes on from there; when no later param holds them, it and all after it are
// left out (the buffer ends there), for the sizes to confirm. Params before a frozen one
// keep their places, so it stops after at most as many layouts as frozen runs.
Result<std::optional<std::string>> FitRule(const SavedBuffer& s, const BufferLayoutRule& rule,
                                           Fit* out) {
  const std::vector<BufferParam>& params = s.params;
  Fit& fit = *out;
  std::vector<bool> frozen(params.size(), false);
  Status ok = Status::Ok();
  std::string first_mismatch;  // what failed before any param was taken for frozen
  size_t resume = params.size();  // in buffer order: params at kept positions >= are checked
  while (true) {
    fit.kept.clear();
    std::vector<BufferParam> kept_params;
    for (size_t i = 0; i < params.size(); ++i) {
      if (frozen[i]) continue;
      fit.kept.push_back(i);
      kept_params.push_back(params[i]);
    }
    auto computed = CoalescedBufferLayout(kept_params, rule);
    if (!computed.ok()) return computed.status().With(s.where);
    fit.layout = std::move(*computed);
    ok = Status::Ok();
    size_t failed = fit.kept.size();
    for (size_t j = std::min(resume, fit.kept.size()); j-- > 0;) {
      ok = CheckPlace(s, fit.kept[j], Place(s.form, fit.layout, j));
      if (!ok.ok()) {
        failed = j;
        if (first_mismatch.empty()) first_mismatch = ok.message();
        break;
      }
    }
    if (ok.ok()) break;
    // The first later param (buffer order) that holds the values at the failed place.
    std::optional<size_t> holder;
    for (size_t m = failed; m-- > 0;) {
      if (CheckPlace(s, fit.kept[m], Place(s.form, fit.layout, failed)).ok()) {
        holder = m;
        break;
      }
    }
    // None: it and every param after it are frozen (the buffer ends there), which the
    // sizes checked below confirm or not.
    const size_t first_kept = holder ? *holder + 1 : 0;
    for (size_t m = first_kept; m <= failed; ++m) frozen[fit.kept[m]] = true;
    resume = first_kept;
    if (std::count(frozen.begin(), frozen.end(), false) == 0) break;  // nothing is left
  }
  if (ok.ok()) ok = CheckBucketSizes(s, fit);
  if (ok.ok()) return std::optional<std::string>();
  return std::optional<std::string>(first_mismatch.empty() ? ok.message() : first_mismatch);
}

// The layout that fits, and its rule's text.
struct FoundLayout {
  Fit fit;
  std::string rule;
};

// Every candidate is tried: two that fit with different offsets (constant params next to
// zero-filled gaps could do that) leave the file unread rather than guessed. nullopt: none
// fits (`tried` says why each did not).
Result<std::optional<FoundLayout>> FindLayout(const SavedBuffer& s,
                                              const std::vector<BufferLayoutRule>& rules,
                                              std::string* tried) {
  std::optional<FoundLayout> found;
  for (const BufferLayoutRule& rule : rules) {
    Fit fit;
    FC_ASSIGN_OR_RETURN(const std::optional<std::string> mismatch, FitRule(s, rule, &fit));
    if (mismatch) {
      *tried += "; " + RuleText(rule) + ": " + *mismatch;
      continue;
    }
    if (found && !SamePlaces(s.form, found->fit, fit)) {
      return DataLossError(s.where + ": two Megatron buffer layouts fit (" + found->rule + "; " +
                           RuleText(rule) + ") with different offsets; not guessing");
    }
    if (!found) found = FoundLayout{std::move(fit), FormText(s.form) + RuleText(rule)};
  }
  return found;
}

}  // namespace

Result<std::vector<BufferLayoutRule>> Reader::LayoutCandidates(
    int64_t p, int64_t v, std::optional<int64_t> rank_numel) const {
  std::vector<std::optional<int64_t>> sizes;
  const std::optional<bool> overlap = PickleBool(args_ ? args_->Find("overlap_grad_reduce") : nullptr);
  const std::optional<bool> with_step =
      PickleBool(args_ ? args_->Find("overlap_param_gather_with_optimizer_step") : nullptr);
  // Megatron disables bucketing without overlap_grad_reduce, after the first pipeline stage,
  // after the first model chunk, and with overlap_param_gather_with_optimizer_step.
  if (!overlap.value_or(false) || p > 0 || v > 0 || with_step.value_or(false)) {
    sizes.push_back(std::nullopt);
  } else if (auto b = ArgInt("ddp_bucket_size")) {
    sizes.push_back(*b);
  } else if (auto nb = ArgInt("ddp_num_buckets")) {
    // Megatron's get_model: bucket_size = the rank's parameter count // ddp_num_buckets.
    if (*nb <= 0 || !rank_numel) {
      return DataLossError(args_file_ + ": args.ddp_num_buckets " + std::to_string(*nb) +
                           " is not a count of buckets");
    }
    sizes.push_back(std::max<int64_t>(*rank_numel / *nb, 1));
  } else {
    // Megatron's default, max(40M, 1M x DP), with DP counted with or without context
    // parallelism depending on the version: both are tried.
    // (Degrees as saved in args, bounded so the products cannot overflow.)
    const int64_t dp = std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24);
    const int64_t cp = std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
    sizes.push_back(std::max<int64_t>(40000000, 1000000 * dp));
    if (cp > 1) sizes.push_back(std::max<int64_t>(40000000, 1000000 * dp * cp));
  }
  // Megatron-Core 0.8 - 0.13.0's shared embedding padding (distrib_optim_layout.h), for
  // the data-parallel sizes the buffer may have had: DP, DP x CP, over the distributed
  // optimizer instances.
  const int64_t dp = std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24);
  const int64_t cp = std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
  const int64_t instances =
      std::clamp<int64_t>(ArgInt("num_distributed_optimizer_instances").value_or(1), 1, 1 << 24);
  const bool busbw =
      PickleBool(args_ ? args_->Find("ddp_pad_buckets_for_high_nccl_busbw") : nullptr).value_or(false);
  std::set<int64_t> dps;
  for (int64_t d : {dp, dp * cp}) {
    dps.insert(d);
    if (d % instances == 0) dps.insert(d / instances);
  }
  std::vector<BufferLayoutRule> out;
  for (int64_t align : {64, 1}) {
    for (const auto& size : sizes) {
      out.push_back(BufferLayoutRule{align, size});
      if (align != 64) continue;  // the rule came with the alignment
      for (int64_t d : dps) {
        const int64_t unit = std::lcm(std::lcm(d, int64_t{128}), busbw ? int64_t{1} << 16 : 1);
        out.push_back(BufferLayoutRule{align, size, d, unit});
      }
    }
  }
  return out;
}

Status Reader::ReadDistribOptim(const Grid& grid, const Pieces& pieces, const Degrees& deg,
                                int64_t vpp) {
  for (const auto& [pet, f] : grid) {
    const auto [p, e, t] = pet;
    FC_RETURN_IF_ERROR(ReadRankDistribOptim(*f, pieces, p, e, t, deg, vpp));
  }
  return Status::Ok();
}

Status Reader::ReadRankDistribOptim(const RankFile& model, const Pieces& pieces, int64_t p,
                                    int64_t e, int64_t t, const Degrees& deg, int64_t vpp) {
  const std::string rank_dir = model.rel.substr(0, model.rel.find('/'));
  const std::string rel = rank_dir + "/" + std::string(kDistribOptimFile);
  if (!PathExists(dir_ + "/" + rel)) {
    return NotFoundError(rel + " is missing (other ranks have theirs)");
  }
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> f,
                      OpenRankFile(dir_, rel, static_cast<uint32_t>(files_.size()), false));
  bool has_experts = false;
  for (int64_t v = 0; v < vpp && !has_experts; ++v) {
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      has_experts |= IsExpertPiece(pc);
    }
  }
  // A ChainedOptimizer saves a list, one entry per optimizer (None where this process is not
  // DP rank 0 of that optimizer's group): [dense] or, with MoE, [dense, expert]; with
  // overlap_param_gather_with_optimizer_step and virtual pipeline chunks, a dense optimizer
  // per chunk ([chunk 0, chunk 1, ..., expert]); a lone optimizer saves its dict.
  std::vector<const PV*> dense = {&f->root};
  const PV* expert = nullptr;
  if (f->root.is_list()) {
    const auto& items = f->root.items;
    const size_t extra = has_experts ? 1 : 0;
    const bool per_chunk =
        vpp > 1 && items.size() == static_cast<size_t>(vpp) + extra &&
        PickleBool(args_ ? args_->Find("overlap_param_gather_with_optimizer_step") : nullptr)
            .value_or(false);
    if (items.size() != 1 + extra && !per_chunk) {
      return UnimplementedError(rel + " holds " + std::to_string(items.size()) +
                                " optimizers (a ChainedOptimizer); fc reads " +
                                (has_experts ? "two (dense, expert)" : "one") +
                                " for this rank's params, or one per model chunk (+ expert) "
                                "with overlap_param_gather_with_optimizer_step");
    }
    dense.clear();
    for (size_t k = 0; k + extra < items.size(); ++k) {
      dense.push_back(items[k] && !items[k]->is_none() ? items[k].get() : nullptr);
    }
    expert = has_experts && items.back() && !items.back()->is_none() ? items.back().get()
                                                                     : nullptr;
  } else if (has_experts) {
    return DataLossError(rel + " holds one optimizer, but " + model.rel +
                         " has expert params (a separate optimizer's)");
  }
  // Dense params are read from EP rank 0 only (the other EP ranks' copies are not used).
  if (e == 0) {
    for (size_t k = 0; k < dense.size(); ++k) {
      const std::string which =
          dense.size() > 1 ? rel + " (model chunk " + std::to_string(k) + " optimizer)" : rel;
      if (dense[k] == nullptr) return DataLossError(which + ": no state for the dense params");
      const std::optional<int64_t> chunk =
          dense.size() > 1 ? std::optional<int64_t>(static_cast<int64_t>(k)) : std::nullopt;
      FC_RETURN_IF_ERROR(ReadOptimizerState(model, *f, *dense[k], which, false, pieces, p, e, t,
                                            deg, vpp, chunk));
    }
  }
  if (has_experts) {
    if (expert == nullptr) return DataLossError(rel + ": no state for the expert params");
    FC_RETURN_IF_ERROR(ReadOptimizerState(model, *f, *expert, rel + " (expert optimizer)", true,
                                          pieces, p, e, t, deg, vpp));
  }
  files_.push_back(std::move(f));
  index_.files.push_back(FileInfo{files_.back()->rel, files_.back()->file->size()});
  return Status::Ok();
}

Result<std::optional<int64_t>> Reader::RankNumel(const RankFile& model, const Pieces& pieces,
                                                 int64_t p, int64_t e, int64_t t,
                                                 int64_t vpp) const {
  std::optional<int64_t> rank_numel;  // for args.ddp_num_buckets (LayoutCandidates)
  if (ArgInt("ddp_num_buckets")) {
    int64_t total = 0;
    for (int64_t v = 0; v < vpp; ++v) {
      for (const Piece& pc : pieces.at({p, e, t, v})) {
        FC_ASSIGN_OR_RETURN(Located l, model.Locate(*pc.value, "'" + pc.name + "'"));
        FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(l.shape));
        const std::optional<int64_t> sum = CheckedAdd(total, n);
        if (!sum) return OutOfRangeError(model.rel + ": parameter count overflows");
        total = *sum;
      }
    }
    rank_numel = total;
  }
  return rank_numel;
}

Status Reader::ReadOptimizerState(const RankFile& model, const RankFile& f, const PV& state,
                                  const std::string& rel, bool experts, const Pieces& pieces,
                                  int64_t p, int64_t e, int64_t t, const Degrees& deg,
                                  int64_t vpp, std::optional<int64_t> chunk) {
  const PV* root = &state;
  if (PickleDictEntries(root) == nullptr) {
    return DataLossError(rel + ": the saved object is " + root->DebugString() +
                         ", expected the distributed optimizer's parameter state");
  }
  FC_ASSIGN_OR_RETURN(const Form form, StateForm(*root, rel));
  // The padding the older forms add (to a multiple of the data-parallel size, with or
  // without context parallelism) is less than this.
  const int64_t max_padding =
      std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24) *
      std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
  FC_ASSIGN_OR_RETURN(const std::vector<Buffer> buffers,
                      RankBuffers(model, pieces, p, e, t, vpp, experts, chunk));
  int64_t saved_buffers = 0;
  for (const auto& [k, v] : *PickleDictEntries(root)) {
    if (k && k->is_int()) ++saved_buffers;
  }
  if (saved_buffers != static_cast<int64_t>(buffers.size())) {
    return DataLossError(rel + " holds " + std::to_string(saved_buffers) + " buffers; the " +
                         (chunk ? std::string("model chunk") : std::to_string(vpp) + " model chunk(s)") +
                         " of " + model.rel + " make " + std::to_string(buffers.size()) +
                         " (one per chunk and dtype)");
  }
  FC_ASSIGN_OR_RETURN(const std::optional<int64_t> rank_numel,
                      RankNumel(model, pieces, p, e, t, vpp));
  const std::optional<bool> untie =
      PickleBool(args_ ? args_->Find("untie_embeddings_and_output_weights") : nullptr);
  const bool shared_embeddings = deg.pp > 1 && !untie.value_or(false);
  for (size_t g = 0; g < buffers.size(); ++g) {
    const Buffer& b = buffers[g];
    FC_ASSIGN_OR_RETURN(const SavedBuffer s, LoadSavedBuffer(f, model, *root, form, buffers, g,
                                                             rel, shared_embeddings, max_padding));
    std::vector<BufferLayoutRule> rules;
    if (form == Form::kWhole) {
      // One buffer, params back to back, nothing special for a shared embedding.
      rules.push_back(BufferLayoutRule{1, std::nullopt, 0, 0, false});
    } else {
      FC_ASSIGN_OR_RETURN(rules, LayoutCandidates(p, b.v, rank_numel));
      if (form == Form::kPerBucket) rules = PerBucketRules(rules, shared_embeddings);
    }
    std::string tried;
    FC_ASSIGN_OR_RETURN(const std::optional<FoundLayout> found, FindLayout(s, rules, &tried));
    if (!found) {
      return DataLossError(s.where + ": no Megatron buffer layout fits (params of " + model.rel +
                           " in reverse order" + tried + ")");
    }
    optim_layouts_.insert(found->rule);
    for (size_t j = 0, i = 0; i < b.params.size(); ++i) {
      if (j == found->fit.kept.size() || found->fit.kept[j] != i) {
        frozen_.insert(b.params[i]->name);  // not in the buffer: no optimizer state
        continue;
      }
      std::array<Located, 3> states3;
      for (size_t r = 0; r < 3; ++r) {
        const auto [tensor, offset] = Place(form, found->fit.layout, j);
        Located& l = states3[r];
        l = s.flat[r][tensor];
        l.shape = b.located[i].shape;
        l.strides = RowMajorStrides(l.shape);
        l.first += static_cast<uint64_t>(offset) * 4;
        l.where = f.rel + ": " + std::string(kOptimRoles[r]) + " of '" + b.params[i]->name + "'";
      }
      optim_[{p, e, t, b.v, b.params[i]->name}] = std::move(states3);
      ++j;
    }
  }
  return Status::Ok();
}

}  // namespace fc::megatron_internal
