// ReadDeepSpeedCheckpoint: DeepSpeed save/tag dirs -> CheckpointIndex.
// Layout, names and contract: include/fc/format/deepspeed.h; file facts:
// shared/reference/deepspeed.md.
//
// Every file is a torch.save zip or legacy stream; its pickle is parsed into a value tree
// (nothing runs) and the tensors are located inside their storages. The ZeRO flat
// partitions are never copied: each param's piece of a partition becomes a flattened-range
// chunk pointing at the partition's bytes, so padding (tail padding for ZeRO-1/2 and
// BF16_Optimizer, per-param ceil-div padding for ZeRO-3) is simply never addressed.
//
// Each model-parallel rank is read on its own into tensor families (weights, frozen,
// buffers, other module tensors, module, exp_avg, exp_avg_sq, step); pipeline stages of one
// TP rank are then united (first stage wins for shared params) and the layer files added;
// last the TP ranks are merged. A TP merge never touches data either: concatenation along
// an axis only moves a chunk's box, and the vocabulary cut and the two-sub-param split only
// narrow a chunk to some rows of its box (RowSlice), which for a flattened range is a
// sub-range and for a strided block a byte offset.
#include "src/format/deepspeed/reader.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_access.h"
#include "fc/core/checked_math.h"
#include "fc/codec/pickle_globals.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"
#include "src/format/deepspeed/names.h"
#include "src/format/deepspeed/parsed_files.h"

namespace fc {
namespace deepspeed_internal {

using json_internal::ShapeText;

namespace {

// The dir to read and its tag: `path` itself, or the tag dir its `latest` (else
// `latest_universal`) file names.
struct TagDir {
  std::string dir, tag;
};

Result<TagDir> FindTagDir(const std::string& path) {
  std::string dir = path;
  std::string tag;
  if (!HasStateFiles(path) && !IsUniversalDir(path)) {
    // A save dir: `latest` names the tag; a dir holding only a UCP: `latest_universal`.
    FC_ASSIGN_OR_RETURN(std::optional<std::string> latest, LatestTag(path, "latest"));
    if (!latest) {
      FC_ASSIGN_OR_RETURN(latest, LatestTag(path, "latest_universal"));
    }
    if (latest) {
      dir = path + "/" + *latest;
      tag = *latest;
      if (!IsDirectory(dir)) {
        return NotFoundError(path + ": the latest file names tag '" + *latest + "', but " + dir +
                             " is not a directory");
      }
    }
  }
  if (tag.empty()) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.find_last_of('/');
    tag = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  return TagDir{dir, tag};
}

// The model states of a rank: mp_rank_XX_model_states.pt, else DP rank 0's ZeRO-3 ones.
const PtFile* ModelOf(const RankFiles& rf) {
  return rf.model ? rf.model : (rf.model_z3.empty() ? nullptr : rf.model_z3.begin()->second);
}

// The index's tensors out of the merged families, in family order; tied aliases get the
// owner's chunks (weights only; module.* has both names already). Errors: kDataLoss when a
// tensor's chunks do not hold its elements exactly once (`dir` names the checkpoint).
Result<std::vector<TensorEntry>> IndexTensors(Families all, const std::string& dir) {
  std::vector<TensorEntry> out;
  for (Family i : {kWeights, kFrozen, kBuffers, kOther}) {
    for (TensorEntry& t : all.tensors[i]) out.push_back(std::move(t));
  }
  std::set<std::string> have;
  for (const TensorEntry& t : out) have.insert(t.key);
  for (const auto& alias_owner : all.aliases) {
    // Named references, not structured bindings: clang 14 (the fuzz build) cannot capture
    // those in the lambdas below.
    const std::string& alias = alias_owner.first;
    const std::string& owner = alias_owner.second;
    if (have.count(alias)) {
      // The alias came in as an "other" module tensor; point it at the owner's weights.
      auto a = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == alias; });
      auto o = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == owner; });
      if (o != out.end() && a != out.end()) {
        TensorEntry copy = *o;
        copy.key = alias;
        *a = std::move(copy);
      }
      continue;
    }
    auto o = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == owner; });
    if (o == out.end()) continue;
    TensorEntry copy = *o;
    copy.key = alias;
    out.push_back(std::move(copy));
    have.insert(alias);
  }
  for (Family i : {kModule, kExpAvg, kExpAvgSq, kStep}) {
    for (TensorEntry& t : all.tensors[i]) out.push_back(std::move(t));
  }
  // Every element of every tensor is covered exactly once by construction, except when a
  // file lies (e.g. a param listed twice); count elements to catch that.
  for (const TensorEntry& t : out) {
    int64_t covered = 0;
    for (const Chunk& c : t.chunks) covered += c.stored_elements();
    const int64_t want = *CheckedNumElements(t.global_shape);
    if (covered != want) {
      return DataLossError(dir + ": tensor '" + t.key + "' has " + std::to_string(covered) +
                           " elements in its chunks, shape " + ShapeText(t.global_shape) +
                           " needs " + std::to_string(want) +
                           " (a param listed twice in param_shapes?)");
    }
  }
  return out;
}

}  // namespace

void Reader::SetAttr(const std::string& k, const std::string& v, const std::string& where) {
  // The first value wins; ranks disagreeing on such facts (ds_version) is not an error.
  (void)where;
  index_.attributes.emplace(k, v);
}

Result<PtFile*> Reader::Open(const std::string& rel) {
  const uint32_t idx = static_cast<uint32_t>(files_.size());
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(dir_, rel, idx));
  index_.files.push_back(FileInfo{rel, pt->file->size()});
  files_.push_back(std::move(pt));
  return files_.back().get();
}

Status Reader::OpenDirFiles(DirFiles* files) {
  const std::string& dir = dir_;
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::sort(names.begin(), names.end());
  std::map<int64_t, RankFiles>& ranks = files->ranks;
  auto& layers = files->layers;
  auto& experts = files->experts;
  bool& moe = files->moe;
  int64_t& skipped_optim = files->skipped_optim;
  // MoE (expert files present): the module and expert weights are read; the ZeRO files too
  // (ReadMoeZero12) when there is one model-parallel rank and no pipeline, the layout
  // DeepSpeed's MoE checkpoints are known in (expert groups partitioned over their own
  // expert-data-parallel ranks, no param_shapes; zero_to_fp32 cannot read them). The
  // expp_rank_* files hold {'optimizer': None} under ZeRO and are never read.
  bool moe_single = true;
  for (const std::string& n : names) {
    const NameInfo info = ClassifyName(n);
    moe = moe || info.kind == FileKind::kExpert;
    if (info.kind == FileKind::kPipelineLayer ||
        ((info.kind == FileKind::kModelMp || info.kind == FileKind::kOptim ||
          info.kind == FileKind::kExpert) && info.mp != 0)) {
      moe_single = false;
    }
  }
  moe_ = moe && moe_single;
  for (const std::string& n : names) {
    const NameInfo info = ClassifyName(n);
    if (info.kind == FileKind::kOther) continue;
    if (info.kind == FileKind::kExpertOptim || (moe && !moe_ && info.kind == FileKind::kOptim)) {
      ++skipped_optim;
      continue;
    }
    FC_ASSIGN_OR_RETURN(PtFile* raw, Open(n));
    if (info.kind == FileKind::kExpert) {
      experts[info.mp].push_back(raw);
      continue;
    }
    if (info.kind == FileKind::kPipelineLayer) {
      layers[info.mp].emplace_back(info.layer, raw);
      continue;
    }
    RankFiles& rf = ranks[info.mp];
    if (info.kind == FileKind::kModelMp) rf.model = raw;
    else if (info.kind == FileKind::kModelZero3) rf.model_z3[info.dp] = raw;
    else if (!rf.optim.emplace(info.dp, raw).second) {
      return DataLossError(dir + ": two optimizer files for DP rank " + std::to_string(info.dp) +
                           " and mp rank " + std::to_string(info.mp) + " (" + n + ")");
    }
  }
  if (ranks.empty()) {
    // Expert, pipeline layer or MoE optimizer files alone: the save's own model states file
    // is what is missing, not the checkpoint.
    if (!experts.empty() || !layers.empty() || skipped_optim > 0) {
      return NotFoundError(dir + ": mp_rank_00_model_states.pt is missing (the dir holds " +
                           (experts.empty() ? layers.empty() ? "MoE optimizer" : "pipeline layer"
                                            : "expert") +
                           " files of a DeepSpeed save, but no mp_rank_XX_model_states.pt or "
                           "*_optim_states.pt)");
    }
    return NotFoundError(dir + ": no DeepSpeed *_model_states.pt / *_optim_states.pt files");
  }
  pipeline_ = !layers.empty();
  return Status::Ok();
}

Result<Reader::Degrees> Reader::FindDegrees(const DirFiles& files) {
  const std::string& dir = dir_;
  const std::map<int64_t, RankFiles>& ranks = files.ranks;
  const auto& layers = files.layers;
  const int64_t mps = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != mps - 1) {
    return NotFoundError(dir + ": files of mp_rank " + std::to_string(mps - 1) +
                         " expected, found mp_rank up to " + std::to_string(ranks.rbegin()->first));
  }
  const PtFile* first_model = ModelOf(ranks.begin()->second);
  // Degrees (deepspeed.md section 1): TP = the number of layer file TP ranks for a pipeline,
  // else checkpoint_parallel_dimensions, else one TP rank per mp_rank; the mp_rank files of
  // a pipeline are ordered stage-major (pp0_tp0, pp0_tp1, ...).
  std::optional<int64_t> dims_pp, dims_tp;
  if (first_model != nullptr) {
    if (const PV* dims = first_model->root.Find("checkpoint_parallel_dimensions")) {
      dims_pp = IntOf(dims->Find("pp_degree"));
      dims_tp = IntOf(dims->Find("tp_degree"));
    }
  }
  int64_t tp = mps;
  if (pipeline_) {
    tp = static_cast<int64_t>(layers.size());
    if (layers.rbegin()->first != tp - 1) {
      return NotFoundError(dir + ": pipeline layer files of TP rank " + std::to_string(tp - 1) +
                           " expected, found model_" + std::to_string(layers.rbegin()->first));
    }
  } else if (dims_tp && *dims_tp >= 1) {
    tp = *dims_tp;
  }
  if (mps % tp != 0) {
    return DataLossError(dir + ": " + std::to_string(mps) + " mp_rank files do not split into " +
                         std::to_string(tp) + " TP ranks per pipeline stage");
  }
  const int64_t pp = mps / tp;
  if (dims_pp && dims_tp && (*dims_pp != pp || *dims_tp != tp)) {
    return DataLossError(first_model->name + ": checkpoint_parallel_dimensions says pp " +
                         std::to_string(*dims_pp) + " x tp " + std::to_string(*dims_tp) +
                         ", the files are pp " + std::to_string(pp) + " x tp " +
                         std::to_string(tp));
  }
  if (pp > 1 && !pipeline_ && !universal_) {
    return DataLossError(dir + ": pipeline degree " + std::to_string(pp) +
                         " but no layer_XX-model_YY-model_states.pt files");
  }
  return Degrees{tp, pp, first_model};
}

// A Universal Checkpoint's zero/optimizer_state.pt: its ZeRO stage and DP degree.
Status Reader::ReadUniversalOptimizerState() {
  const std::string& dir = dir_;
  if (universal_ && PathExists(dir + "/zero/optimizer_state.pt")) {
    FC_ASSIGN_OR_RETURN(const PtFile* os, Open("zero/optimizer_state.pt"));
    std::string stage = "unknown";
    if (os->root.Find("fp32_flat_groups") != nullptr) stage = "3";
    else if (auto s = IntOf(os->root.Find("zero_stage"))) stage = std::to_string(*s);
    else if (os->root.Find("group_paddings") != nullptr) stage = "1";  // BF16_Optimizer
    SetAttr("deepspeed.zero_stage", stage, os->name);
    if (auto pc = IntOf(os->root.Find("partition_count"))) {
      SetAttr("deepspeed.dp_degree", std::to_string(*pc), os->name);
    }
  }
  if (universal_) SetAttr("deepspeed.optimizer", "universal", dir);
  return Status::Ok();
}

Status Reader::ReadRanks(DirFiles& files, int64_t tp, RanksRead* out) {
  const std::string& dir = dir_;
  std::map<int64_t, RankFiles>& ranks = files.ranks;
  auto& layers = files.layers;
  const auto& experts = files.experts;
  const bool moe = files.moe;
  std::vector<Families>& per_tp = out->per_tp;
  std::vector<std::set<std::string>>& buffer_names = out->buffer_names;
  ParamList& order = out->order;
  std::set<std::string>& ordered = out->ordered;
  bool& ucp_info = out->ucp_info;
  per_tp.resize(static_cast<size_t>(tp));
  buffer_names.resize(static_cast<size_t>(tp));
  for (auto& [mp, rf] : ranks) {
    FC_RETURN_IF_ERROR(ReadRank(mp, rf));
    if (auto e = experts.find(mp); e != experts.end()) {
      FC_RETURN_IF_ERROR(AddExpertFiles(e->second));
    }
    const int64_t t = mp % tp;
    FC_RETURN_IF_ERROR(UnionStage(TakeFamilies(),
                                  dir + " pipeline stage " + std::to_string(mp / tp) + " (" +
                                      MpName(mp) + ")",
                                  &per_tp[static_cast<size_t>(t)]));
    const PtFile* m = ModelOf(rf);
    if (m == nullptr) continue;
    if (const PV* u = m->root.Find("universal_checkpoint_info"); u && !u->is_none()) {
      ucp_info = true;
    }
    if (auto v = PickleStr(m->root.Find("ds_version"))) SetAttr("deepspeed.ds_version", *v, m->name);
    if (const auto* b = PickleListItems(m->root.Find("buffer_names"))) {
      for (const auto& i : *b) {
        if (auto s = PickleStr(i.get())) buffer_names[static_cast<size_t>(t)].insert(*s);
      }
    }
    if (universal_) {
      FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(*m));
      for (const ParamList& g : groups) {
        for (const auto& [name, shape] : g) {
          if (ordered.insert(name).second) order.emplace_back(name, shape);
        }
      }
    }
  }
  if (moe) {
    size_t n = 0;
    for (const auto& [mp, fs] : experts) n += fs.size();
    index_.attributes["deepspeed.moe"] =
        std::to_string(n) + " expert files read (16-bit weights); " +
        (moe_optimizer_read_ ? "optimizer states read from the zero_pp_rank files"
                             : "optimizer files not read");
  }
  for (auto& [t, ls] : layers) {
    std::sort(ls.begin(), ls.end());
    FC_RETURN_IF_ERROR(AddLayerFiles(ls, buffer_names[static_cast<size_t>(t)], ordered,
                                     &per_tp[static_cast<size_t>(t)]));
  }
  return Status::Ok();
}

void Reader::SetIndexAttributes(const std::string& tag, const Degrees& deg, bool ucp_info,
                                bool rules) {
  const int64_t tp = deg.tp, pp = deg.pp;
  std::set<std::string> opaque;
  for (const auto& f : files_) CollectUnknownGlobals(f->root, DeepSpeedAllowedGlobal, &opaque);
  if (!opaque.empty()) {
    std::string s;
    for (const std::string& g : opaque) s += (s.empty() ? "" : ", ") + g;
    index_.attributes["deepspeed.opaque_globals"] = s;
  }
  index_.attributes["deepspeed.tag"] = tag;
  index_.attributes["deepspeed.tp_degree"] = std::to_string(tp);
  index_.attributes["deepspeed.pp_degree"] = std::to_string(pp);
  index_.attributes["deepspeed.universal_checkpoint_info"] = ucp_info ? "present" : "absent";
  if (tp > 1) {
    index_.attributes["deepspeed.tp_merge"] =
        options_.tp_axis ? "tensor_parallel rules of " + options_.tp_axis_origin
        : rules          ? "universal_checkpoint_info"
                         : "none (per-rank names mp_rank_XX.<name>)";
  }
  if (!module_dtype_.empty()) index_.attributes["deepspeed.module_dtype"] = module_dtype_;
  if (!master_dtype_.empty()) index_.attributes["deepspeed.master_dtype"] = master_dtype_;
}

void Reader::RetainParsedFiles() {
  auto parsed = std::make_shared<ParsedFiles>(dir_);
  for (const std::unique_ptr<PtFile>& f : files_) {
    DeepSpeedPtFile pt;
    pt.legacy = f->legacy;
    pt.size = f->file->size();
    pt.storages = f->StorageSpans();
    pt.root = std::move(f->root);
    parsed->Add(index_.files[f->index].path, std::move(pt));
  }
  files_.clear();
  index_.retained = std::move(parsed);
}

Result<CheckpointIndex> Reader::Read(const std::string& path) {
  if (!IsDirectory(path)) return NotFoundError(path + ": not a directory");
  FC_ASSIGN_OR_RETURN(TagDir tag_dir, FindTagDir(path));
  const std::string& dir = tag_dir.dir;
  dir_ = dir;
  universal_ = IsUniversalDir(dir);
  index_.format = CheckpointFormat::kDeepSpeed;
  index_.root = dir;
  DirFiles files;
  FC_RETURN_IF_ERROR(OpenDirFiles(&files));
  FC_ASSIGN_OR_RETURN(const Degrees deg, FindDegrees(files));
  const int64_t tp = deg.tp;
  FC_RETURN_IF_ERROR(ReadUniversalOptimizerState());
  if (files.skipped_optim > 0 && !files.moe) {
    return UnimplementedError(dir + ": expp_rank_*_optim_states.pt (MoE optimizer) without "
                              "layer_*_expert_* files");
  }
  FC_RETURN_IF_ERROR(PrepareMoe(files, deg.first_model));
  RanksRead read;
  FC_RETURN_IF_ERROR(ReadRanks(files, tp, &read));
  const PtFile* first_model = deg.first_model;
  std::optional<TpRules> rules;
  if (tp > 1 && first_model != nullptr) {
    const PV* info = first_model->root.Find("universal_checkpoint_info");
    if (info != nullptr && PickleDictEntries(info) != nullptr) {
      FC_ASSIGN_OR_RETURN(rules, ParseTpRules(*first_model, info));
    }
  }
  FC_ASSIGN_OR_RETURN(Families all, MergeTp(std::move(read.per_tp), rules ? &*rules : nullptr));
  if (universal_) FC_RETURN_IF_ERROR(AddUniversalParams(read.order, tp, &all));
  SetIndexAttributes(tag_dir.tag, deg, read.ucp_info, rules.has_value());
  FC_ASSIGN_OR_RETURN(index_.tensors, IndexTensors(std::move(all), dir));
  RetainParsedFiles();
  return std::move(index_);
}

}  // namespace deepspeed_internal

using deepspeed_internal::HasStateFiles;
using deepspeed_internal::IsUniversalDir;
using deepspeed_internal::LatestTag;
using deepspeed_internal::Reader;

bool IsDeepSpeedCheckpointDir(const std::string& dir) {
  if (!IsDirectory(dir)) return false;
  if (HasStateFiles(dir)) return true;
  if (IsUniversalDir(dir)) return true;
  for (const char* file : {"latest", "latest_universal"}) {
    auto latest = LatestTag(dir, file);
    if (latest.ok() && latest->has_value() && HasStateFiles(dir + "/" + **latest)) return true;
  }
  return false;
}

Result<CheckpointIndex> ReadDeepSpeedCheckpoint(const std::string& path,
                                                DeepSpeedReadOptions options) {
  Reader reader(std::move(options));
  return reader.Read(path);
}

}  // namespace fc
