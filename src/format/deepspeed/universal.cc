// Universal Checkpoints (ds_to_universal.py): zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt
// beside the copied model states.
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

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

Status Reader::ReadUniversalParams(const std::vector<std::pair<std::string, Shape>>& order,
                                   bool check_shapes, Families* f) {
  const std::string zdir = dir_ + "/zero";
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(zdir));
  std::set<std::string> dirs;
  for (const std::string& n : names) {
    if (IsDirectory(zdir + "/" + n)) dirs.insert(n);
  }
  std::vector<std::pair<std::string, std::optional<Shape>>> params;
  for (const auto& [name, shape] : order) {
    if (!dirs.erase(name)) {
      return NotFoundError(zdir + "/" + name + "/ is missing (param_shapes lists '" + name + "')");
    }
    params.emplace_back(name, shape);
  }
  for (const std::string& n : dirs) params.emplace_back(n, std::nullopt);
  static constexpr std::pair<const char*, Family> kStates[] = {
      {"fp32", kWeights}, {"exp_avg", kExpAvg}, {"exp_avg_sq", kExpAvgSq}, {"step", kStep}};
  for (const auto& [name, known] : params) {
    std::optional<Shape> fp32_shape;
    for (const auto& [state, family] : kStates) {
      const std::string rel = "zero/" + name + "/" + state + ".pt";
      if (!PathExists(dir_ + "/" + rel)) {
        if (family == kWeights) return NotFoundError(dir_ + "/" + rel + " is missing");
        continue;
      }
      FC_ASSIGN_OR_RETURN(const PtFile* pt, Open(rel));
      // ds_to_universal saves {'param': tensor, 'cat_dim', ...} (stage <= 2) or the raw
      // flat tensor (stage 3); step.pt holds the raw step (int or 0-d tensor).
      const PV* v = &pt->root;
      if (PickleDictEntries(v) != nullptr) {
        v = v->Find("param");
        if (v == nullptr) return DataLossError(rel + ": a dict without 'param'");
      }
      if (family == kStep) {
        if (auto i = IntOf(v)) {
          SetAttr("deepspeed.step", std::to_string(*i), rel);
          continue;
        }
        if (v->kind == PV::Kind::kFloat) {
          SetAttr("deepspeed.step", std::to_string(v->float_value), rel);
          continue;
        }
      }
      FC_ASSIGN_OR_RETURN(Located l, pt->Locate(v, "param"));
      Shape shape = l.shape;
      Chunk c = WholeChunk(l, pt->index);
      if (family != kStep && known && check_shapes && l.shape != *known) {
        if (l.shape.size() != 1 || l.numel != *CheckedNumElements(*known)) {
          return DataLossError(rel + ": param has shape " + ShapeText(l.shape) +
                               ", param_shapes says " + ShapeText(*known));
        }
        shape = *known;  // the stage-3 raw form: the flat param
        FC_ASSIGN_OR_RETURN(c, FlatChunk(l, pt->index, shape, FlatRange{0, l.numel}, 0, rel));
      }
      if (family == kWeights) {
        fp32_shape = shape;
        master_dtype_ = std::string(DTypeName(l.dtype));
      } else if (family != kStep && shape != *fp32_shape) {
        return DataLossError(rel + ": shape " + ShapeText(shape) + ", fp32.pt has " +
                             ShapeText(*fp32_shape));
      }
      TensorEntry t;
      t.key = std::string(kFamilyPrefix[family]) + name;
      t.dtype = l.dtype;
      t.global_shape = shape;
      t.chunks.push_back(std::move(c));
      f->tensors[family].push_back(std::move(t));
    }
  }
  return Status::Ok();
}

Status Reader::AddUniversalParams(const ParamList& order, int64_t tp, Families* all_out) {
  Families& all = *all_out;
  Families u;
  FC_RETURN_IF_ERROR(ReadUniversalParams(order, tp == 1, &u));
  // ds_to_universal (0.19) also writes zero/<name>/fp32.pt, module value as float32, for
  // module entries without optimizer state (frozen params, buffers, tied aliases), which
  // the copied model states hold too: those keep the model states' copy (as stored).
  std::set<std::string> module_only;
  for (size_t fam : {kFrozen, kBuffers}) {
    for (const TensorEntry& t : all.tensors[fam]) {
      module_only.insert(t.key);
      // TP copies kept per rank (mp_rank_YY.<name>): ds_to_universal wrote TP rank 0's
      if (t.key.starts_with("mp_rank_") && t.key.find('.') != std::string::npos) {
        module_only.insert(t.key.substr(t.key.find('.') + 1));
      }
    }
  }
  for (const auto& [alias, owner] : all.aliases) module_only.insert(alias);
  std::set<std::string> with_state;
  for (const TensorEntry& t : u.tensors[kExpAvg]) {
    with_state.insert(t.key.substr(std::string_view(kFamilyPrefix[kExpAvg]).size()));
  }
  std::erase_if(u.tensors[kWeights], [&](const TensorEntry& t) {
    return module_only.count(t.key) > 0 && with_state.count(t.key) == 0;
  });
  std::set<std::string> have;
  for (const TensorEntry& t : u.tensors[kWeights]) have.insert(t.key);
  std::erase_if(all.tensors[kOther], [&](const TensorEntry& t) { return have.count(t.key) > 0; });
  for (size_t i = 0; i < kFamilies; ++i) {
    for (TensorEntry& t : u.tensors[i]) all.tensors[i].push_back(std::move(t));
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
