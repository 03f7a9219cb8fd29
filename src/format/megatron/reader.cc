// The Megatron legacy reader's steps (reader.h): from the directory to the merged index.
#include "src/format/megatron/reader.h"

#include <algorithm>

#include "fc/core/checked_math.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"
#include "src/format/megatron/optimizer_states.h"

namespace fc::megatron_internal {
namespace {

using json_internal::ShapeText;

// The last component of a directory path (trailing slashes ignored).
std::string DirName(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

Result<CheckpointIndex> Reader::Read(const std::string& path) {
  FC_ASSIGN_OR_RETURN(dir_, ResolveDir(path));
  index_.format = CheckpointFormat::kMegatronLegacy;
  index_.root = dir_;
  index_.attributes["megatron.checkpoint_dir"] = DirName(dir_);
  FC_RETURN_IF_ERROR(FindRankGrid());
  FC_RETURN_IF_ERROR(CheckDegrees());
  FC_RETURN_IF_ERROR(OpenRankFiles());
  FC_RETURN_IF_ERROR(CheckIterationAndVersion());
  FC_RETURN_IF_ERROR(CollectModelChunks());
  FC_RETURN_IF_ERROR(CountLayers());
  ReadOptimizerStates();
  const Degrees& deg = ranks_.deg;
  TpTensors model, optim;
  model.per_tp.resize(static_cast<size_t>(deg.tp));
  optim.per_tp.resize(static_cast<size_t>(deg.tp));
  for (int64_t v = 0; v < vpp_; ++v) {
    for (int64_t p = 0; p < deg.pp; ++p) {
      for (int64_t e = 0; e < deg.ep; ++e) {
        for (int64_t t = 0; t < deg.tp; ++t) {
          FC_RETURN_IF_ERROR(NameRankTensors(v, p, e, t, &model, &optim));
        }
      }
    }
  }
  swiglu_ = PickleBool(args_ ? args_->Find("swiglu") : nullptr);
  FC_RETURN_IF_ERROR(MergeTp(model.order, model.per_tp, swiglu_));
  FC_RETURN_IF_ERROR(MergeTp(optim.order, optim.per_tp, swiglu_));
  FC_RETURN_IF_ERROR(CheckCoverage());
  AddModelAttributes();
  AddOptimizerAttributes();
  AddOptimizerStep();
  AddOpaqueGlobals();
  return std::move(index_);
}

Result<std::string> Reader::ResolveDir(const std::string& path) {
  if (!IsDirectory(path)) return NotFoundError(path + ": not a directory");
  if (HasRankDirs(path)) return path;
  FC_ASSIGN_OR_RETURN(std::optional<std::string> sub, LatestIterationDir(path));
  if (!sub) {
    return NotFoundError(path + ": neither a Megatron iteration dir (mp_rank_*/" +
                         std::string(kRankFile) + ") nor a save dir (" +
                         std::string(kLatestFile) + ")");
  }
  const std::string dir = path + "/" + *sub;
  if (!IsDirectory(dir)) {
    return NotFoundError(path + "/" + std::string(kLatestFile) + " names '" + *sub + "', but " +
                         dir + " is not a directory");
  }
  return dir;
}

Status Reader::CheckDegree(const char* key, int64_t found, const std::string& what) const {
  const auto v = ArgInt(key);
  if (!v) return Status::Ok();
  const int64_t want = std::max<int64_t>(*v, 1);
  if (want != found) {
    return DataLossError(args_file_ + ": args." + key + " is " + std::to_string(*v) + ", but " +
                         dir_ + " holds " + std::to_string(found) + " " + what);
  }
  return Status::Ok();
}


Status Reader::FindRankGrid() {
  FC_ASSIGN_OR_RETURN(std::vector<RankDir> dirs, ListRankDirs(dir_));
  // The first rank's args decide what a second index means (_PPP or _EEE).
  const std::string first_rel = dirs[0].name + "/" + std::string(kRankFile);
  if (!PathExists(dir_ + "/" + first_rel)) return NotFoundError(dir_ + "/" + first_rel + ": missing");
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> first, OpenRankFile(dir_, first_rel, 0));
  files_.push_back(std::move(first));
  args_ = ArgsDict(*files_[0]);
  args_file_ = first_rel;
  bool second_is_ep = false;
  if (dirs[0].numbers.size() == 2) {
    const int64_t pp_arg = ArgInt("pipeline_model_parallel_size").value_or(0);
    const int64_t ep_arg = ArgInt("expert_model_parallel_size").value_or(0);
    second_is_ep = pp_arg <= 1 && ep_arg > 1;
  }
  FC_ASSIGN_OR_RETURN(ranks_, ArrangeRankGrid(dir_, dirs, second_is_ep));
  // A full grid; the name of a missing rank follows Megatron's get_checkpoint_name.
  return CheckFullGrid(dir_, ranks_);
}

Status Reader::CheckDegrees() const {
  const Degrees& deg = ranks_.deg;
  FC_RETURN_IF_ERROR(CheckDegree("tensor_model_parallel_size", deg.tp, "TP ranks (mp_rank_TT)"));
  FC_RETURN_IF_ERROR(CheckDegree("pipeline_model_parallel_size", deg.pp, "pipeline stages"));
  FC_RETURN_IF_ERROR(CheckDegree("expert_model_parallel_size", deg.ep, "expert-parallel ranks"));
  if (auto etp = ArgInt("expert_tensor_parallel_size"); etp && *etp != deg.tp && deg.ep > 1) {
    return UnimplementedError(args_file_ + ": expert_tensor_parallel_size " + std::to_string(*etp) +
                              " differs from the TP degree " + std::to_string(deg.tp) +
                              "; fc does not read that layout yet");
  }
  return Status::Ok();
}

Status Reader::OpenRankFiles() {
  const Degrees& deg = ranks_.deg;
  for (int64_t p = 0; p < deg.pp; ++p) {
    for (int64_t e = 0; e < deg.ep; ++e) {
      for (int64_t t = 0; t < deg.tp; ++t) {
        const std::string n = ranks_.by_rank.at({t, p, e});
        const std::string rel = n + "/" + std::string(kRankFile);
        RankFile* f = nullptr;
        if (rel == args_file_) {
          f = files_[0].get();
        } else {
          FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> opened,
                              OpenRankFile(dir_, rel, static_cast<uint32_t>(files_.size())));
          files_.push_back(std::move(opened));
          f = files_.back().get();
        }
        f->tp = t;
        f->pp = p;
        f->ep = e;
        grid_[{p, e, t}] = f;
        if (PathExists(dir_ + "/" + n + "/" + std::string(kDistribOptimFile))) ++distrib_optim_;
      }
    }
  }
  // Files are listed in the order they were opened (file index == position).
  std::sort(files_.begin(), files_.end(),
            [](const auto& a, const auto& b) { return a->index < b->index; });
  for (const auto& f : files_) index_.files.push_back(FileInfo{f->rel, f->file->size()});
  return Status::Ok();
}

Status Reader::CheckIterationAndVersion() {
  std::optional<int64_t> iteration;
  std::string version;
  for (const auto& f : files_) {
    const auto it = PickleInt(f->root.Find("iteration"));
    if (it && iteration && *it != *iteration) {
      return DataLossError(f->rel + ": iteration " + std::to_string(*it) + ", " + args_file_ +
                           ": " + std::to_string(*iteration));
    }
    if (it) iteration = it;
    std::string v;
    if (const PV* cv = f->root.Find("checkpoint_version")) {
      if (cv->kind == PV::Kind::kFloat) v = FloatText(cv->float_value);
      else if (cv->is_int()) v = FloatText(static_cast<double>(cv->int_value));
      if (!v.empty() && ((cv->kind == PV::Kind::kFloat && cv->float_value < 2.0) ||
                         (cv->is_int() && cv->int_value < 2))) {
        return UnimplementedError(f->rel + ": checkpoint_version " + v + " (< 2.0: the old QKV "
                                  "ordering that Megatron's fix_query_key_value_ordering "
                                  "rewrites on load); fc does not read it");
      }
    }
    if (!version.empty() && v != version) {
      return DataLossError(f->rel + ": checkpoint_version " + v + ", " + args_file_ + ": " +
                           version);
    }
    version = v;
  }
  if (iteration) index_.attributes["megatron.iteration"] = std::to_string(*iteration);
  index_.attributes["megatron.checkpoint_version"] = version.empty() ? "absent" : version;
  if (iteration && index_.attributes["megatron.checkpoint_dir"].starts_with("iter_")) {
    int64_t named = -1;
    ParseUint(std::string_view(index_.attributes["megatron.checkpoint_dir"]).substr(5), &named);
    if (named != *iteration) {
      return DataLossError(args_file_ + ": iteration " + std::to_string(*iteration) +
                           ", but the directory is " + index_.attributes["megatron.checkpoint_dir"]);
    }
  }
  return Status::Ok();
}

Status Reader::CollectModelChunks() {
  virtual_pp_ = files_[0]->root.Find("model") == nullptr;
  if (virtual_pp_) {
    while (files_[0]->root.Find("model" + std::to_string(vpp_)) != nullptr) ++vpp_;
    if (vpp_ == 0) return DataLossError(args_file_ + ": no 'model' (or 'model0') state dict");
    FC_RETURN_IF_ERROR(CheckDegree("virtual_pipeline_model_parallel_size", vpp_,
                                   "virtual pipeline chunks (model0, model1, ...)"));
  } else {
    vpp_ = 1;
    if (auto v = ArgInt("virtual_pipeline_model_parallel_size"); v && *v > 1) {
      return DataLossError(args_file_ + ": args.virtual_pipeline_model_parallel_size is " +
                           std::to_string(*v) + ", but the file holds one 'model' state dict");
    }
  }
  for (const auto& [pet, f] : grid_) {
    for (int64_t v = 0; v < vpp_; ++v) {
      const PV* m = f->root.Find(ModelKey(v));
      if (m == nullptr || PickleDictEntries(m) == nullptr) {
        return DataLossError(f->rel + ": '" + ModelKey(v) + "' is " +
                             (m ? m->DebugString() : std::string("missing")) +
                             ", expected the model's state dict");
      }
      auto& list = pieces_[{std::get<0>(pet), std::get<1>(pet), std::get<2>(pet), v}];
      FC_RETURN_IF_ERROR(FlattenStateDict(*f, *m, "", 0, &list, &skipped_));
    }
  }
  return Status::Ok();
}

Status Reader::CountLayers() {
  const Degrees& deg = ranks_.deg;
  for (int64_t v = 0; v < vpp_; ++v) {
    for (int64_t p = 0; p < deg.pp; ++p) {
      std::set<int64_t> local;
      for (const Piece& pc : pieces_.at({p, 0, 0, v})) {
        const auto parts = Split(pc.name, '.');
        if (auto li = LayerComponent(parts)) {
          int64_t n = 0;
          ParseUint(parts[*li], &n);
          local.insert(n);
        }
      }
      if (!local.empty() && (*local.begin() != 0 || *local.rbegin() + 1 != static_cast<int64_t>(local.size()))) {
        return DataLossError(grid_.at({p, 0, 0})->rel + ": " + ModelKey(v) +
                             " layer numbers are not 0.." + std::to_string(local.size() - 1) +
                             " (found up to " + std::to_string(*local.rbegin()) + ")");
      }
      layer_offset_[{v, p}] = layers_;
      layers_ += static_cast<int64_t>(local.size());
    }
  }
  if (auto nl = ArgInt("num_layers"); nl && layers_ > 0 && *nl != layers_) {
    return DataLossError(args_file_ + ": args.num_layers is " + std::to_string(*nl) + ", but the " +
                         std::to_string(deg.pp * vpp_) + " pipeline chunks hold " +
                         std::to_string(layers_) + " layers");
  }
  num_experts_ = ArgInt("num_experts");
  if (num_experts_ && *num_experts_ > 0 && *num_experts_ % deg.ep != 0) {
    return DataLossError(args_file_ + ": args.num_experts " + std::to_string(*num_experts_) +
                         " is not divisible by the " + std::to_string(deg.ep) +
                         " expert-parallel ranks");
  }
  return Status::Ok();
}

void Reader::ReadOptimizerStates() {
  const Degrees& deg = ranks_.deg;
  if (distrib_optim_ > 0) {
    const size_t opened = files_.size();
    Status st = ReadDistribOptim(grid_, pieces_, deg, vpp_);
    if (st.ok() && !frozen_.empty()) {
      // A frozen param is frozen on every TP rank: each param with states has them on all.
      std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, int64_t> ranks;
      for (const auto& [key, states] : optim_) {
        const auto& [p, e, t, v, name] = key;
        ++ranks[{p, e, v, name}];
      }
      for (const auto& [key, n] : ranks) {
        if (n != deg.tp) {
          st = DataLossError("'" + std::get<3>(key) + "' has optimizer states on " +
                             std::to_string(n) + " of " + std::to_string(deg.tp) +
                             " TP ranks (taken for frozen on the others)");
          break;
        }
      }
    }
    if (!st.ok()) {
      optim_not_read_ = st.message();
      optim_.clear();
      optim_layouts_.clear();
      frozen_.clear();
      files_.resize(opened);
      index_.files.resize(opened);
    }
  }
  opt_ = files_[0]->root.Find("optimizer");
  opt0_ = opt_ != nullptr && opt_->is_list() && !opt_->items.empty() ? opt_->items[0].get() : opt_;
  float16_ = distrib_optim_ == 0 && opt0_ != nullptr &&
                       opt0_->Find("fp32_from_fp16_params") != nullptr;
  fp32_optimizer_ = distrib_optim_ == 0 && opt0_ != nullptr && IsFp32OptimizerState(*opt0_);
  if (float16_ || fp32_optimizer_) {
    Status st = ReadFloat16Optimizer(grid_, pieces_, vpp_);
    if (!st.ok()) {
      optim_not_read_ = st.message();
      optim_.clear();
    }
  }
}

Status Reader::NameRankTensors(int64_t v, int64_t p, int64_t e, int64_t t, TpTensors* model,
                               TpTensors* optim) {
  const Degrees& deg = ranks_.deg;
  const RankFile& f = *grid_.at({p, e, t});
  const std::vector<Piece>& list = pieces_.at({p, e, t, v});
  // Local experts per EP rank: num_experts / EP, else as many as this rank holds.
  int64_t local_experts = num_experts_ && *num_experts_ > 0 ? *num_experts_ / deg.ep : 0;
  if (local_experts == 0) {
    for (const Piece& pc : list) {
      if (auto x = ExpertOf(Split(pc.name, '.'))) {
        local_experts = std::max(local_experts, x->local + 1);
      }
    }
  }
  for (const Piece& pc : list) {
    std::vector<std::string_view> parts = Split(pc.name, '.');
    std::string layer_text, expert_text;
    if (auto li = LayerComponent(parts)) {
      int64_t n = 0;
      ParseUint(parts[*li], &n);
      layer_text = std::to_string(layer_offset_.at({v, p}) + n);
      parts[*li] = layer_text;
    }
    const auto x = ExpertOf(parts);
    if (x) {
      if (x->local >= local_experts) {
        return DataLossError(f.rel + ": '" + pc.name + "' is local expert " +
                             std::to_string(x->local) + ", but each of the " +
                             std::to_string(deg.ep) + " EP ranks holds " +
                             std::to_string(local_experts) + " (args.num_experts)");
      }
      expert_text = std::string(parts[x->component].substr(0, x->stem)) +
                    std::to_string(e * local_experts + x->local);
      parts[x->component] = expert_text;
    } else if (e > 0) {
      continue;  // a copy of EP rank 0's tensor
    }
    const std::string name = Join(parts);
    auto& mine = model->per_tp[static_cast<size_t>(t)];
    FC_ASSIGN_OR_RETURN(Located l, f.Locate(*pc.value, "'" + pc.name + "'"));
    if (auto it = mine.find(name); it != mine.end()) {
      // Held by several stages (tied or shared): the first stage's copy is read.
      if (it->second.dtype != l.dtype || it->second.shape != l.shape) {
        return DataLossError(l.where + " (global name '" + name + "') is " +
                             std::string(DTypeName(l.dtype)) + " " + ShapeText(l.shape) +
                             ", " + it->second.where + " is " +
                             std::string(DTypeName(it->second.dtype)) + " " +
                             ShapeText(it->second.shape));
      }
      continue;
    }
    if (t == 0) model->order.push_back(name);
    mine.emplace(name, std::move(l));
    if (auto it = optim_.find({p, e, t, v, pc.name}); it != optim_.end()) {
      for (size_t r = 0; r < kOptimRoles.size(); ++r) {
        std::string key = "optimizer." + std::string(kOptimRoles[r]) + "." + name;
        if (t == 0) optim->order.push_back(key);
        optim->per_tp[static_cast<size_t>(t)].emplace(std::move(key), it->second[r]);
      }
    }
  }
  return Status::Ok();
}

Status Reader::CheckCoverage() const {
  for (const TensorEntry& t : index_.tensors) {
    int64_t covered = 0;
    for (const Chunk& c : t.chunks) covered += c.stored_elements();
    FC_ASSIGN_OR_RETURN(const int64_t want, CheckedNumElements(t.global_shape));
    if (covered != want) {
      return DataLossError(dir_ + ": tensor '" + t.key + "' has " + std::to_string(covered) +
                           " elements in its chunks, shape " + ShapeText(t.global_shape) +
                           " needs " + std::to_string(want));
    }
  }
  return Status::Ok();
}

}  // namespace fc::megatron_internal
