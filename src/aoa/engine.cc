#include "fc/aoa/engine.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fc/aoa/macros.h"
#include "fc/aoa/statement.h"
#include "fc/core/checked_math.h"
#include "slice.h"

namespace fc::aoa {

using internal::Slice;
using internal::ViewOp;

namespace {

std::string ShapeStr(const Shape& s) { return FormatIntList(s); }

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

// A source of data: a stored tensor (by model key), or the constant of an added tensor.
struct SourceInfo {
  std::string key;  // model key (stored) or the added name (fill)
  Shape shape;
  DType dtype = DType::kFloat32;
  bool fill = false;
  bool stored = true;  // the model key itself exists in the checkpoint
  double fill_value = 0.0;
};

struct Var {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  std::vector<Slice> slices;
  int out_degree = 0;
  int consumer_node = -1;  // first statement that consumed it
  int producer_node = -1;  // -1 for a source tensor
};

Result<double> ParseFill(const Attribute& a) {
  if (const int64_t* v = std::get_if<int64_t>(&a.value)) return static_cast<double>(*v);
  const std::string& s = std::get<std::string>(a.value);
  if (s == "zeros" || s == "zero") return 0.0;
  if (s == "ones" || s == "one") return 1.0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
    return InvalidArgumentError("fill='" + s + "' is not a number, 'zeros' or 'ones'");
  }
  return v;
}

Result<int64_t> IntAttr(const Attribute& a) {
  if (const int64_t* v = std::get_if<int64_t>(&a.value)) return *v;
  return InvalidArgumentError("attribute " + a.name + "= needs an integer, got '" +
                              std::get<std::string>(a.value) + "'");
}

Result<std::string> StringAttr(const Attribute& a) {
  if (const std::string* s = std::get_if<std::string>(&a.value)) return *s;
  return InvalidArgumentError("attribute " + a.name + "= needs a quoted string");
}

Result<Shape> ListAttr(const Attribute& a) {
  FC_ASSIGN_OR_RETURN(std::string s, StringAttr(a));
  return ParseIntList(s, a.name);
}

Result<DType> DTypeAttr(const Attribute& a) {
  FC_ASSIGN_OR_RETURN(std::string s, StringAttr(a));
  Result<DType> d = ParseDType(s);
  if (!d.ok()) return InvalidArgumentError(a.name + "='" + s + "' is not a known dtype");
  return d;
}

}  // namespace

struct AoaEngine::Impl {
  EngineOptions options;
  bool reverse = false;
  std::vector<TensorMeta> source_metas;
  std::optional<std::vector<TensorMeta>> dest_metas;
  std::unique_ptr<TensorDirectory> source_dir;
  std::unique_ptr<TensorDirectory> dest_dir;
  MacroExpansion expansion;
  std::vector<Statement> executed;  // statements as run (after reversal)
  std::vector<int> executed_nodes;

  std::vector<SourceInfo> sources;
  std::vector<Var> vars;
  std::vector<int> input_ids;  // one var per source model key
  std::unordered_map<std::string, int> inputs;  // visible source vars by name
  std::unordered_map<std::string, int> inters;  // visible produced vars by name
  std::unordered_map<std::string, int> removed;  // name -> node of the removing statement
  std::unordered_map<std::string, int> added;    // `_ -> name` without shape -> node
  // Convert mode: destination model key -> var (-1: nothing to load) and producing node.
  std::unordered_map<std::string, int> outputs;
  std::vector<OutputTensor> output_list;  // sorted by key (model outputs)
  std::vector<std::string> warnings;

  const Provenance& prov() const { return expansion.provenance; }
  Status Err(int node, std::string_view msg) const { return prov().Error(node, msg); }

  // --- setup ----------------------------------------------------------------------------------

  Status IndexSources() {
    std::unordered_set<std::string_view> seen;
    for (const TensorMeta& t : source_metas) {
      if (!seen.insert(t.key).second) {
        return InvalidArgumentError("source tensor " + Quote(t.key) + " is listed twice");
      }
      if (!t.dtype) return InvalidArgumentError("source tensor " + Quote(t.key) + " has no dtype");
      for (int64_t d : t.shape) {
        if (d < 0) {
          return InvalidArgumentError("source tensor " + Quote(t.key) + " has a negative extent");
        }
      }
      FC_RETURN_IF_ERROR_WITH(CheckedNumElements(t.shape), "source tensor " + Quote(t.key));
    }
    source_dir = std::make_unique<TensorDirectory>(source_metas, options.state_suffixes);
    if (dest_metas) {
      std::unordered_set<std::string_view> dseen;
      for (const TensorMeta& t : *dest_metas) {
        if (!dseen.insert(t.key).second) {
          return InvalidArgumentError("destination tensor " + Quote(t.key) + " is listed twice");
        }
      }
      dest_dir = std::make_unique<TensorDirectory>(*dest_metas, options.state_suffixes);
    }
    // One input variable per model key that has a non-scalar tensor.
    for (const std::string& key : source_dir->model_keys()) {
      const TensorMeta* meta = source_dir->FindModel(key);
      if (meta == nullptr) continue;  // only scalar states (beta pow accumulators)
      SourceInfo info;
      info.key = key;
      info.shape = meta->shape;
      info.dtype = *meta->dtype;
      info.stored = source_dir->Find(key) != nullptr;
      const int src = static_cast<int>(sources.size());
      sources.push_back(std::move(info));
      Var v;
      v.name = key;
      v.shape = meta->shape;
      v.dtype = *meta->dtype;
      Slice s;
      s.source = src;
      s.src = Box::Whole(meta->shape);
      s.dst = s.src;
      v.slices.push_back(std::move(s));
      const int id = static_cast<int>(vars.size());
      vars.push_back(std::move(v));
      input_ids.push_back(id);
      inputs.emplace(key, id);
    }
    return Status::Ok();
  }

  // --- variables ------------------------------------------------------------------------------

  Result<int> Lookup(const std::string& name, int node) const {
    if (auto it = inters.find(name); it != inters.end()) return it->second;
    if (auto it = inputs.find(name); it != inputs.end()) return it->second;
    if (auto it = removed.find(name); it != removed.end()) {
      return Err(node, Quote(name) + " was removed by the statement at " +
                           prov().Location(it->second) +
                           " and cannot be used afterwards");
    }
    if (auto it = added.find(name); it != added.end()) {
      return Err(node, Quote(name) + " was added with `_ -> " + name +
                           "` without a shape, so it has no data; give it shape= and dtype= "
                           "to use it as an input");
    }
    return Err(node, Quote(name) +
                         " should be assigned before it is used: no earlier statement produces "
                         "it and the source checkpoint has no such tensor");
  }

  void Consume(int id, int node) {
    Var& v = vars[id];
    if (v.out_degree++ == 0) v.consumer_node = node;
  }

  int Define(const std::string& name, Var v, int node) {
    v.name = name;
    v.producer_node = node;
    const int id = static_cast<int>(vars.size());
    vars.push_back(std::move(v));
    BindName(name, id);
    return id;
  }

  // Makes `name` refer to variable `id` (shadowing a source tensor of that name).
  void BindName(const std::string& name, int id) {
    inters[name] = id;
    removed.erase(name);
    added.erase(name);
    if (dest_dir && dest_dir->HasModelKey(name)) outputs[name] = id;
  }

  // --- statements -----------------------------------------------------------------------------

  // Turns a statement written in the load direction into the one to run in reverse mode.
  Result<Statement> Reverse(const Statement& st, int node) const {
    Statement r;
    r.lhs = st.rhs;
    r.rhs = st.lhs;
    const bool add_or_remove = std::find(st.lhs.begin(), st.lhs.end(), "_") != st.lhs.end() ||
                               std::find(st.rhs.begin(), st.rhs.end(), "_") != st.rhs.end();
    for (const Attribute& a : st.attrs) {
      if (a.name == "dtype" && !add_or_remove) {
        return Err(node, "dtype= cannot be reversed; use src_dtype= and dst_dtype= in reverse mode");
      }
      if (a.name == "shape" && !add_or_remove) {
        return Err(node, "shape= on a one-to-one statement (a view) cannot be reversed; use "
                         "reshape= in reverse mode");
      }
      if (a.name == "permute") {
        FC_ASSIGN_OR_RETURN(std::string s, StringAttr(a));
        Result<Shape> perm = ParseIntList(s, "permute");
        if (!perm.ok()) return prov().Wrap(node, perm.status());
        Shape inv(perm->size());
        for (size_t i = 0; i < perm->size(); ++i) {
          if ((*perm)[i] < 0 || (*perm)[i] >= static_cast<int64_t>(perm->size())) {
            return Err(node, "permute='" + s + "' is not a permutation");
          }
          inv[(*perm)[i]] = static_cast<int64_t>(i);
        }
        r.attrs.push_back(Attribute{a.name, FormatIntList(inv)});
        continue;
      }
      if (a.name == "src_dtype") {
        r.attrs.push_back(Attribute{"dst_dtype", a.value});
        continue;
      }
      if (a.name == "dst_dtype") {
        r.attrs.push_back(Attribute{"src_dtype", a.value});
        continue;
      }
      r.attrs.push_back(a);
    }
    return r;
  }

  Status Run(const Statement& st, int node) {
    static const std::set<std::string, std::less<>> kKnown = {
        "axis", "sizes", "permute", "dtype", "src_dtype", "dst_dtype", "reshape", "shape", "fill"};
    for (const Attribute& a : st.attrs) {
      if (!kKnown.count(a.name)) {
        return Err(node, "unsupported attribute " + Quote(a.name) +
                             " (known: axis, sizes, permute, dtype, src_dtype, dst_dtype, "
                             "reshape, shape, fill)");
      }
    }
    const bool lhs_none = std::find(st.lhs.begin(), st.lhs.end(), "_") != st.lhs.end();
    const bool rhs_none = std::find(st.rhs.begin(), st.rhs.end(), "_") != st.rhs.end();
    if (lhs_none && rhs_none) return Err(node, "'_ -> _' does nothing");
    if (lhs_none) {
      if (st.lhs.size() != 1) return Err(node, "'_' must stand alone left of '->'");
      return Add(st, node);
    }
    if (rhs_none) {
      if (st.rhs.size() != 1) return Err(node, "'_' must stand alone right of '->'");
      return Remove(st, node);
    }
    if (st.lhs.size() > 1 && st.rhs.size() > 1) {
      return Err(node, "a statement maps one name to many (split) or many to one (merge), "
                       "not many to many");
    }
    if (st.lhs.size() > 1) return Merge(st, node);
    if (st.rhs.size() > 1) return Split(st, node);
    return OneToOne(st, node);
  }

  Status Add(const Statement& st, int node) {
    const Attribute* shape_a = st.FindAttr("shape");
    const Attribute* dtype_a = st.FindAttr("dtype");
    const Attribute* fill_a = st.FindAttr("fill");
    for (const Attribute& a : st.attrs) {
      if (a.name != "shape" && a.name != "dtype" && a.name != "fill") {
        return Err(node, "'_ -> name' takes only shape=, dtype= and fill=, not " + a.name + "=");
      }
    }
    if (!shape_a) {
      if (dtype_a || fill_a) return Err(node, "dtype= and fill= need shape= in '_ -> name'");
      for (const std::string& name : st.rhs) {
        inters.erase(name);
        inputs.erase(name);
        added[name] = node;
        if (dest_dir && dest_dir->HasModelKey(name)) outputs[name] = -1;
      }
      return Status::Ok();
    }
    if (st.rhs.size() != 1) return Err(node, "'_ -> name, shape=...' adds one tensor at a time");
    if (!dtype_a) return Err(node, "'_ -> " + st.rhs[0] + ", shape=...' needs dtype=");
    Result<Shape> shape = ListAttr(*shape_a);
    if (!shape.ok()) return prov().Wrap(node, shape.status());
    Result<DType> dtype = DTypeAttr(*dtype_a);
    if (!dtype.ok()) return prov().Wrap(node, dtype.status());
    double value = 0.0;
    if (fill_a) {
      Result<double> v = ParseFill(*fill_a);
      if (!v.ok()) return prov().Wrap(node, v.status());
      value = *v;
    }
    Result<int64_t> numel = CheckedNumElements(*shape);
    if (!numel.ok()) return prov().Wrap(node, numel.status());
    SourceInfo info;
    info.key = st.rhs[0];
    info.shape = *shape;
    info.dtype = *dtype;
    info.fill = true;
    info.fill_value = value;
    const int src = static_cast<int>(sources.size());
    sources.push_back(std::move(info));
    Var v;
    v.shape = *shape;
    v.dtype = *dtype;
    Slice s;
    s.source = src;
    s.src = Box::Whole(*shape);
    s.dst = s.src;
    if (*numel > 0) v.slices.push_back(std::move(s));
    inputs.erase(st.rhs[0]);
    Define(st.rhs[0], std::move(v), node);
    return Status::Ok();
  }

  Status Remove(const Statement& st, int node) {
    for (const Attribute& a : st.attrs) {
      if (a.name != "shape" && a.name != "dtype" && a.name != "fill") {
        return Err(node, "'name -> _' takes only shape=, dtype= and fill=, not " + a.name + "=");
      }
    }
    const Attribute* shape_a = st.FindAttr("shape");
    const Attribute* dtype_a = st.FindAttr("dtype");
    for (const std::string& name : st.lhs) {
      FC_ASSIGN_OR_RETURN(int id, Lookup(name, node));
      Var& v = vars[id];
      if (v.out_degree > 0) {
        return Err(node, "cannot remove " + Quote(name) + ": its data is already used by the "
                         "statement at " + prov().Location(v.consumer_node) +
                         " (remove a name before or instead of using it)");
      }
      if (shape_a) {
        Result<Shape> shape = ListAttr(*shape_a);
        if (!shape.ok()) return prov().Wrap(node, shape.status());
        if (*shape != v.shape) {
          return Err(node, "cannot remove " + Quote(name) + ": it has shape " + ShapeStr(v.shape) +
                               ", not " + ShapeStr(*shape));
        }
      }
      if (dtype_a) {
        Result<DType> dtype = DTypeAttr(*dtype_a);
        if (!dtype.ok()) return prov().Wrap(node, dtype.status());
        if (*dtype != v.dtype) {
          return Err(node, "cannot remove " + Quote(name) + ": it is " +
                               std::string(DTypeName(v.dtype)) + ", not " +
                               std::string(DTypeName(*dtype)));
        }
      }
      Consume(id, node);
      inters.erase(name);
      inputs.erase(name);
      removed[name] = node;
      if (dest_dir && dest_dir->HasModelKey(name)) outputs[name] = -1;
    }
    return Status::Ok();
  }

  Result<int64_t> AxisOf(const Statement& st, int node, size_t rank) const {
    const Attribute* a = st.FindAttr("axis");
    if (!a) return Err(node, "a split or merge needs axis=");
    Result<int64_t> axis = IntAttr(*a);
    if (!axis.ok()) return prov().Wrap(node, axis.status());
    if (*axis < 0 || *axis >= static_cast<int64_t>(rank)) {
      return Err(node, "axis=" + std::to_string(*axis) + " is out of range for rank " +
                           std::to_string(rank));
    }
    return *axis;
  }

  Status OnlyAttrs(const Statement& st, int node, std::initializer_list<std::string_view> ok,
                   std::string_view what) const {
    for (const Attribute& a : st.attrs) {
      if (std::find(ok.begin(), ok.end(), a.name) == ok.end()) {
        return Err(node, std::string(what) + " does not take " + a.name + "=");
      }
    }
    return Status::Ok();
  }

  Status Split(const Statement& st, int node) {
    FC_RETURN_IF_ERROR(OnlyAttrs(st, node, {"axis", "sizes"}, "a split"));
    FC_ASSIGN_OR_RETURN(int in_id, Lookup(st.lhs[0], node));
    const Var& in = vars[in_id];
    FC_ASSIGN_OR_RETURN(int64_t axis, AxisOf(st, node, in.shape.size()));
    const int64_t len = in.shape[axis];
    const int64_t n = static_cast<int64_t>(st.rhs.size());
    Shape sizes;
    if (const Attribute* a = st.FindAttr("sizes")) {
      Result<Shape> s = ListAttr(*a);
      if (!s.ok()) return prov().Wrap(node, s.status());
      sizes = *s;
      if (static_cast<int64_t>(sizes.size()) != n) {
        return Err(node, "sizes= lists " + std::to_string(sizes.size()) + " sizes for " +
                             std::to_string(n) + " outputs");
      }
      int64_t sum = 0;
      for (int64_t s1 : sizes) sum += s1;
      if (sum != len) {
        return Err(node, "sizes=" + ShapeStr(sizes) + " add up to " + std::to_string(sum) +
                             ", but " + Quote(st.lhs[0]) + " (shape " + ShapeStr(in.shape) +
                             ") has " + std::to_string(len) + " along axis " +
                             std::to_string(axis));
      }
    } else {
      if (len % n != 0) {
        return Err(node, "cannot split " + Quote(st.lhs[0]) + " (shape " + ShapeStr(in.shape) +
                             ") into " + std::to_string(n) + " equal pieces along axis " +
                             std::to_string(axis) + " (use sizes= for uneven pieces)");
      }
      sizes.assign(n, len / n);
    }
    std::vector<Var> pieces(n);
    int64_t start = 0;
    for (int64_t i = 0; i < n; ++i) {
      Var& p = pieces[i];
      p.shape = in.shape;
      p.shape[axis] = sizes[i];
      p.dtype = in.dtype;
      const int64_t stop = start + sizes[i];
      for (const Slice& s : in.slices) {
        const int64_t lo = std::max(start, s.dst.inclusive_min(axis));
        const int64_t hi = std::min(stop, s.dst.exclusive_max(axis));
        if (lo >= hi) continue;
        Box rel = Box::Whole(s.dst.local_shape);
        rel.global_offset[axis] = lo - s.dst.global_offset[axis];
        rel.local_shape[axis] = hi - lo;
        const size_t first = p.slices.size();
        internal::RestrictAll(s, rel, &p.slices);
        for (size_t k = first; k < p.slices.size(); ++k) {
          p.slices[k].dst.global_offset[axis] -= start;
        }
      }
      start = stop;
    }
    Consume(in_id, node);
    for (int64_t i = 0; i < n; ++i) Define(st.rhs[i], std::move(pieces[i]), node);
    return Status::Ok();
  }

  Status Merge(const Statement& st, int node) {
    FC_RETURN_IF_ERROR(OnlyAttrs(st, node, {"axis", "sizes"}, "a merge"));
    std::vector<int> ids;
    for (const std::string& name : st.lhs) {
      FC_ASSIGN_OR_RETURN(int id, Lookup(name, node));
      ids.push_back(id);
    }
    const Var& first = vars[ids[0]];
    FC_ASSIGN_OR_RETURN(int64_t axis, AxisOf(st, node, first.shape.size()));
    for (size_t i = 1; i < ids.size(); ++i) {
      const Var& v = vars[ids[i]];
      if (v.dtype != first.dtype) {
        return Err(node, "cannot merge " + Quote(st.lhs[0]) + " (" +
                             std::string(DTypeName(first.dtype)) + ") with " + Quote(st.lhs[i]) +
                             " (" + std::string(DTypeName(v.dtype)) +
                             "): all inputs of a merge need the same dtype (cast one first)");
      }
      bool same = v.shape.size() == first.shape.size();
      for (size_t d = 0; same && d < v.shape.size(); ++d) {
        same = static_cast<int64_t>(d) == axis || v.shape[d] == first.shape[d];
      }
      if (!same) {
        return Err(node, "cannot merge " + Quote(st.lhs[0]) + " (shape " + ShapeStr(first.shape) +
                             ") with " + Quote(st.lhs[i]) + " (shape " + ShapeStr(v.shape) +
                             ") along axis " + std::to_string(axis) +
                             ": the other axes must match");
      }
    }
    if (const Attribute* a = st.FindAttr("sizes")) {
      Result<Shape> s = ListAttr(*a);
      if (!s.ok()) return prov().Wrap(node, s.status());
      Shape actual;
      for (int id : ids) actual.push_back(vars[id].shape[axis]);
      if (*s != actual) {
        return Err(node, "sizes=" + ShapeStr(*s) + " does not match the inputs' extents " +
                             ShapeStr(actual) + " along axis " + std::to_string(axis));
      }
    }
    Var out;
    out.shape = first.shape;
    out.dtype = first.dtype;
    int64_t offset = 0;
    size_t total = 0;
    for (int id : ids) total += vars[id].slices.size();
    out.slices.reserve(total);
    for (int id : ids) {
      const Var& v = vars[id];
      for (const Slice& s : v.slices) {
        out.slices.push_back(s);
        out.slices.back().dst.global_offset[axis] += offset;
      }
      offset += v.shape[axis];
    }
    out.shape[axis] = offset;
    for (int id : ids) Consume(id, node);
    Define(st.rhs[0], std::move(out), node);
    return Status::Ok();
  }

  Status OneToOne(const Statement& st, int node) {
    const std::string& from = st.lhs[0];
    const std::string& to = st.rhs[0];
    FC_ASSIGN_OR_RETURN(int in_id, Lookup(from, node));
    std::set<std::string> names;
    for (const Attribute& a : st.attrs) names.insert(a.name);
    if (names.empty()) {  // rename
      Var v = vars[in_id];
      v.out_degree = 0;
      v.consumer_node = -1;
      Consume(in_id, node);
      Define(to, std::move(v), node);
      return Status::Ok();
    }
    if (names == std::set<std::string>{"axis"} ||
        names == std::set<std::string>{"axis", "sizes"}) {
      // The reference's 1 -> 1 split: the same variable under a second name, degrees untouched.
      FC_ASSIGN_OR_RETURN(int64_t axis, AxisOf(st, node, vars[in_id].shape.size()));
      if (const Attribute* a = st.FindAttr("sizes")) {
        Result<Shape> s = ListAttr(*a);
        if (!s.ok()) return prov().Wrap(node, s.status());
        if (*s != Shape{vars[in_id].shape[axis]}) {
          return Err(node, "sizes=" + ShapeStr(*s) + " does not match the extent " +
                               std::to_string(vars[in_id].shape[axis]) + " along axis " +
                               std::to_string(axis));
        }
      }
      BindName(to, in_id);
      return Status::Ok();
    }
    if (names == std::set<std::string>{"permute"}) return Transpose(st, node, in_id);
    if (names == std::set<std::string>{"dtype"} ||
        names == std::set<std::string>{"src_dtype", "dst_dtype"}) {
      return CastVar(st, node, in_id);
    }
    if (names == std::set<std::string>{"reshape"}) return ReshapeVar(st, node, in_id);
    if (names == std::set<std::string>{"shape"}) return ViewVar(st, node, in_id);
    if (names.count("src_dtype") || names.count("dst_dtype")) {
      return Err(node, "src_dtype= and dst_dtype= go together, with no other attribute");
    }
    return Err(node, "a one-to-one statement takes a single attribute (permute=, dtype=, "
                     "reshape=, shape= or axis=), or the pair src_dtype=/dst_dtype=");
  }

  Status Transpose(const Statement& st, int node, int in_id) {
    FC_ASSIGN_OR_RETURN(std::string text, StringAttr(*st.FindAttr("permute")));
    Result<Shape> perm = ParseIntList(text, "permute");
    if (!perm.ok()) return prov().Wrap(node, perm.status());
    const Var& in = vars[in_id];
    const size_t rank = in.shape.size();
    std::vector<int64_t> p = *perm;
    if (p.empty()) {  // reverse all axes
      for (size_t i = 0; i < rank; ++i) p.push_back(static_cast<int64_t>(rank - 1 - i));
    }
    std::vector<bool> seen(rank, false);
    bool ok = p.size() == rank;
    for (size_t i = 0; ok && i < p.size(); ++i) {
      ok = p[i] >= 0 && p[i] < static_cast<int64_t>(rank) && !seen[p[i]];
      if (ok) seen[p[i]] = true;
    }
    if (!ok) {
      return Err(node, "permute='" + text + "' is not a permutation of the " +
                           std::to_string(rank) + " axes of " + Quote(st.lhs[0]) + " (shape " +
                           ShapeStr(in.shape) + ")");
    }
    Var out;
    out.dtype = in.dtype;
    out.shape.resize(rank);
    for (size_t i = 0; i < rank; ++i) out.shape[i] = in.shape[p[i]];
    out.slices.reserve(in.slices.size());
    for (const Slice& s : in.slices) {
      Slice t = s;
      t.dst = internal::PermuteBox(s.dst, p);
      ViewOp op;
      op.kind = ViewOp::Kind::kPermute;
      op.perm = p;
      t.ops.push_back(std::move(op));
      out.slices.push_back(std::move(t));
    }
    Consume(in_id, node);
    Define(st.rhs[0], std::move(out), node);
    return Status::Ok();
  }

  Status CastVar(const Statement& st, int node, int in_id) {
    DType target;
    if (const Attribute* a = st.FindAttr("dtype")) {
      if (reverse) {
        return Err(node, "dtype= cannot be reversed; use src_dtype= and dst_dtype=");
      }
      Result<DType> d = DTypeAttr(*a);
      if (!d.ok()) return prov().Wrap(node, d.status());
      target = *d;
    } else {
      Result<DType> src = DTypeAttr(*st.FindAttr("src_dtype"));
      if (!src.ok()) return prov().Wrap(node, src.status());
      Result<DType> dst = DTypeAttr(*st.FindAttr("dst_dtype"));
      if (!dst.ok()) return prov().Wrap(node, dst.status());
      if (vars[in_id].dtype != *src) {
        return Err(node, Quote(st.lhs[0]) + " is " + std::string(DTypeName(vars[in_id].dtype)) +
                             ", but the cast says it is " + std::string(DTypeName(*src)));
      }
      target = *dst;
    }
    Var out = vars[in_id];
    out.out_degree = 0;
    out.consumer_node = -1;
    out.dtype = target;
    for (Slice& s : out.slices) {
      ViewOp op;
      op.kind = ViewOp::Kind::kCast;
      op.dtype = target;
      s.ops.push_back(std::move(op));
    }
    Consume(in_id, node);
    Define(st.rhs[0], std::move(out), node);
    return Status::Ok();
  }

  Status ReshapeVar(const Statement& st, int node, int in_id) {
    FC_ASSIGN_OR_RETURN(std::string text, StringAttr(*st.FindAttr("reshape")));
    Result<Shape> canon = ParseIntList(text, "reshape");
    if (!canon.ok()) return prov().Wrap(node, canon.status());
    if (canon->size() < 3) {
      return Err(node, "reshape='" + text +
                           "' must give the canonical shape [d0, d1, ...] with at least 3 axes; "
                           "the other form is [d0*d1, product of the rest]");
    }
    Result<int64_t> rest = CheckedNumElements(std::span<const int64_t>(*canon).subspan(2));
    std::optional<int64_t> rows = CheckedMul((*canon)[0], (*canon)[1]);
    if (!rest.ok() || !rows) return Err(node, "reshape='" + text + "' overflows");
    const Shape flat = {*rows, *rest};
    const Var& in = vars[in_id];
    Shape target;
    if (in.shape == *canon) {
      target = flat;
    } else if (in.shape == flat) {
      target = *canon;
    } else {
      return Err(node, Quote(st.lhs[0]) + " has shape " + ShapeStr(in.shape) + ", which is neither " +
                           ShapeStr(*canon) + " nor its flattened form " + ShapeStr(flat));
    }
    // As in the reference, a destination that already has the source's shape gets the
    // tensor unchanged.
    if (dest_dir) {
      if (const TensorMeta* m = dest_dir->FindModel(st.rhs[0]); m && m->shape == in.shape) {
        target = in.shape;
      }
    }
    Var out;
    out.shape = target;
    out.dtype = in.dtype;
    if (target == in.shape) {
      out.slices = in.slices;
    } else if (Result<int64_t> n = CheckedNumElements(in.shape); n.ok() && *n > 0) {
      const auto groups = internal::ReshapeGroups(in.shape, target);
      for (const Slice& s : in.slices) ReshapeSlice(s, in.shape, target, groups, &out.slices);
    }
    Consume(in_id, node);
    Define(st.rhs[0], std::move(out), node);
    return Status::Ok();
  }

  // fc's extension `A -> B, shape='[...]'`: B is A's elements in row-major order under any
  // shape of the same element count (e.g. [1, 16] -> [16], dropping the layer axis of one
  // layer cut from a stacked tensor). Forward mode only (Reverse refuses it).
  Status ViewVar(const Statement& st, int node, int in_id) {
    FC_ASSIGN_OR_RETURN(std::string text, StringAttr(*st.FindAttr("shape")));
    Result<Shape> target = ParseIntList(text, "shape");
    if (!target.ok()) return prov().Wrap(node, target.status());
    const Var& in = vars[in_id];
    Result<int64_t> want = CheckedNumElements(*target);
    Result<int64_t> have = CheckedNumElements(in.shape);
    if (!want.ok() || !have.ok()) return Err(node, "shape='" + text + "' overflows");
    for (int64_t d : *target) {
      if (d < 0) return Err(node, "shape='" + text + "' has a negative extent");
    }
    if (*want != *have) {
      return Err(node, Quote(st.lhs[0]) + " has shape " + ShapeStr(in.shape) + " (" +
                           std::to_string(*have) + " elements), which cannot be viewed as " +
                           ShapeStr(*target) + " (" + std::to_string(*want) + " elements)");
    }
    Var out;
    out.shape = *target;
    out.dtype = in.dtype;
    if (*target == in.shape) {
      out.slices = in.slices;
    } else if (*have > 0) {
      const auto groups = internal::ReshapeGroups(in.shape, *target);
      for (const Slice& s : in.slices) ReshapeSlice(s, in.shape, *target, groups, &out.slices);
    }
    Consume(in_id, node);
    Define(st.rhs[0], std::move(out), node);
    return Status::Ok();
  }

  // Appends `s` reshaped from `from` to `to`, cut into pieces where its box is not a
  // rectangle in the new shape (halving along the leading axis with more than one element).
  static void ReshapeSlice(const Slice& s, const Shape& from, const Shape& to,
                           const std::vector<std::pair<int, int>>& groups, std::vector<Slice>* out) {
    if (std::optional<Box> mapped = internal::MapThroughReshape(s.dst, from, to, groups, false)) {
      Slice r = s;
      ViewOp op;
      op.kind = ViewOp::Kind::kReshape;
      op.before = s.dst.local_shape;
      op.after = mapped->local_shape;
      op.groups = groups;
      r.ops.push_back(std::move(op));
      r.dst = std::move(*mapped);
      out->push_back(std::move(r));
      return;
    }
    size_t axis = 0;
    while (axis < s.dst.rank() && s.dst.local_shape[axis] <= 1) ++axis;
    if (axis == s.dst.rank()) return;  // unreachable: one element always maps
    Box lo = Box::Whole(s.dst.local_shape), hi = lo;
    const int64_t len = s.dst.local_shape[axis];
    lo.local_shape[axis] = len / 2;
    hi.global_offset[axis] = len / 2;
    hi.local_shape[axis] = len - len / 2;
    std::vector<Slice> halves;
    internal::RestrictAll(s, lo, &halves);
    internal::RestrictAll(s, hi, &halves);
    for (const Slice& h : halves) ReshapeSlice(h, from, to, groups, out);
  }

  // --- after the statements ------------------------------------------------------------------

  Status Finish() {
    if (dest_dir) return FinishConvert();
    FinishExport();
    return Status::Ok();
  }

  Status FinishConvert() {
    std::vector<std::string> missing;
    for (const std::string& key : dest_dir->model_keys()) {
      if (dest_dir->FindModel(key) == nullptr) continue;  // only scalar states
      if (outputs.count(key)) continue;
      if (added.count(key) || removed.count(key)) {
        outputs[key] = -1;
        continue;
      }
      if (auto it = inputs.find(key); it != inputs.end()) {
        outputs[key] = it->second;
        continue;
      }
      missing.push_back(key);
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + Quote(missing[i]);
      if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
      return InvalidArgumentError(
          "AOA: destination tensor(s) " + list +
          " are produced by no statement and are not in the source checkpoint (declare one "
          "with `_ -> name` if it should not be loaded)");
    }
    for (const auto& [key, id] : outputs) {
      const TensorMeta* meta = dest_dir->FindModel(key);
      OutputTensor out;
      out.key = key;
      if (id < 0) {
        out.shape = meta->shape;
        out.dtype = meta->dtype.value_or(DType::kFloat32);
        out.has_data = false;
        output_list.push_back(std::move(out));
        continue;
      }
      const Var& v = vars[id];
      auto where = [&](std::string msg) -> Status {
        if (v.producer_node >= 0) return Err(v.producer_node, msg);
        return InvalidArgumentError("AOA: " + msg);
      };
      const bool is_param = meta == dest_dir->Find(key);
      if (is_param && meta->dtype && *meta->dtype != v.dtype) {
        return where("destination " + Quote(key) + " is " +
                     std::string(DTypeName(*meta->dtype)) + " but the statements produce " +
                     std::string(DTypeName(v.dtype)) + "; a dtype change needs a cast (e.g. `" +
                     key + " -> " + key + ", dtype='" + std::string(DTypeName(*meta->dtype)) +
                     "'`)");
      }
      if (meta->shape != v.shape) {
        Result<int64_t> a = CheckedNumElements(meta->shape);
        Result<int64_t> b = CheckedNumElements(v.shape);
        if (meta->shape.size() != v.shape.size() || !a.ok() || !b.ok() || *a != *b) {
          return where("destination " + Quote(key) + " has shape " + ShapeStr(meta->shape) +
                       " but the statements produce shape " + ShapeStr(v.shape));
        }
        warnings.push_back("destination " + Quote(key) + " is declared with shape " +
                           ShapeStr(meta->shape) + " but the statements produce shape " +
                           ShapeStr(v.shape) + " (same size; queries use the produced shape)");
      }
      out.shape = v.shape;
      out.dtype = v.dtype;
      output_list.push_back(std::move(out));
    }
    // Produced but never written: almost always a forgotten `name -> _` or a typo.
    for (const auto& [name, id] : inters) {
      if (vars[id].out_degree == 0 && vars[id].producer_node >= 0 && !outputs.count(name)) {
        warnings.push_back(Quote(name) + " is produced by " +
                           prov().Location(vars[id].producer_node) +
                           " but is not a destination tensor and is never used");
      }
    }
    std::sort(warnings.begin(), warnings.end());
    std::sort(output_list.begin(), output_list.end(),
              [](const OutputTensor& a, const OutputTensor& b) { return a.key < b.key; });
    return Status::Ok();
  }

  void FinishExport() {
    for (int id : input_ids) {
      const Var& v = vars[id];
      if (v.out_degree != 0 || inters.count(v.name) || !inputs.count(v.name)) continue;
      outputs[v.name] = id;
    }
    for (const auto& [name, id] : inters) {
      if (vars[id].out_degree == 0) outputs[name] = id;
    }
    for (const auto& [key, id] : outputs) {
      output_list.push_back(OutputTensor{key, vars[id].shape, vars[id].dtype, true});
    }
    std::sort(output_list.begin(), output_list.end(),
              [](const OutputTensor& a, const OutputTensor& b) { return a.key < b.key; });
  }

  // --- queries ------------------------------------------------------------------------------

  // Distinct non-fill sources of a variable, in slice order.
  std::vector<int> SourcesOf(const Var& v) const {
    std::vector<int> out;
    for (const Slice& s : v.slices) {
      if (sources[s.source].fill) continue;
      if (std::find(out.begin(), out.end(), s.source) == out.end()) out.push_back(s.source);
    }
    return out;
  }

  // The dtype of state `suffix` of output `key` (var `v`).
  DType StateDType(const std::string& key, const Var& v, std::string_view suffix) const {
    if (dest_dir) {
      if (const TensorMeta* m = dest_dir->Find(key + std::string(suffix)); m && m->dtype) {
        return *m->dtype;
      }
    }
    for (int src : SourcesOf(v)) {
      if (const TensorMeta* m = source_dir->Find(sources[src].key + std::string(suffix))) {
        return *m->dtype;
      }
    }
    return v.dtype;
  }
};

AoaEngine::AoaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AoaEngine::AoaEngine(AoaEngine&&) noexcept = default;
AoaEngine& AoaEngine::operator=(AoaEngine&&) noexcept = default;
AoaEngine::~AoaEngine() = default;

Result<AoaEngine> AoaEngine::Create(const AoaProgram& program, std::span<const TensorMeta> sources,
                                    std::optional<std::span<const TensorMeta>> destination,
                                    const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->reverse = program.reverse;
  impl->source_metas.assign(sources.begin(), sources.end());
  if (destination) impl->dest_metas.emplace(destination->begin(), destination->end());
  FC_RETURN_IF_ERROR(impl->IndexSources());
  FC_ASSIGN_OR_RETURN(impl->expansion,
                      ExpandMacros(program, *impl->source_dir, impl->dest_dir.get()));
  const auto& stmts = impl->expansion.statements;
  impl->executed.reserve(stmts.size());
  impl->executed_nodes.reserve(stmts.size());
  if (program.reverse) {
    for (auto it = stmts.rbegin(); it != stmts.rend(); ++it) {
      FC_ASSIGN_OR_RETURN(Statement r, impl->Reverse(it->statement, it->node));
      impl->executed.push_back(std::move(r));
      impl->executed_nodes.push_back(it->node);
    }
  } else {
    for (const ExpandedStatement& s : stmts) {
      impl->executed.push_back(s.statement);
      impl->executed_nodes.push_back(s.node);
    }
  }
  for (size_t i = 0; i < impl->executed.size(); ++i) {
    FC_RETURN_IF_ERROR(impl->Run(impl->executed[i], impl->executed_nodes[i]));
  }
  FC_RETURN_IF_ERROR(impl->Finish());
  return AoaEngine(std::move(impl));
}

Result<std::vector<ShardMapping>> AoaEngine::FindShardSources(std::string_view target_key,
                                                              const Box& target_box) const {
  const Impl& m = *impl_;
  std::string model_key(target_key);
  std::string_view suffix;
  bool scalar = false;
  auto it = m.outputs.find(model_key);
  if (it == m.outputs.end()) {
    SplitKey split = SplitStateSuffix(target_key, m.options.state_suffixes);
    if (!split.suffix.empty()) {
      model_key = std::string(split.model_key);
      suffix = split.suffix;
      scalar = split.scalar;
      it = m.outputs.find(model_key);
    }
  }
  if (it == m.outputs.end()) {
    return NotFoundError("AOA: no output tensor " + Quote(target_key));
  }
  std::vector<ShardMapping> out;
  if (it->second < 0) return out;
  const Var& v = m.vars[it->second];
  if (!target_box.SatisfiesInvariants()) {
    return InvalidArgumentError("AOA: query box " + target_box.ToString() + " for " +
                                Quote(target_key) + " is malformed");
  }

  if (scalar) {
    for (int src : m.SourcesOf(v)) {
      const std::string key = m.sources[src].key + std::string(suffix);
      const TensorMeta* meta = m.source_dir->Find(key);
      if (meta == nullptr) continue;
      if (meta->shape.size() != target_box.rank() ||
          !Contains(Box::Whole(meta->shape), target_box)) {
        return InvalidArgumentError("AOA: query box " + target_box.ToString() + " for " +
                                    Quote(target_key) + " does not fit source " + Quote(key) +
                                    " of shape " + ShapeStr(meta->shape));
      }
      ShardMapping e;
      e.kind = MappingKind::kCopy;
      e.target_box = target_box;
      e.source_key = key;
      e.source_box = target_box;
      e.source_shape = meta->shape;
      e.source_dtype = *meta->dtype;
      e.result_dtype = *meta->dtype;
      if (m.dest_dir) {
        if (const TensorMeta* d = m.dest_dir->Find(target_key); d && d->dtype && *d->dtype != e.source_dtype) {
          e.ops.push_back(Cast{*d->dtype});
          e.result_dtype = *d->dtype;
        }
      }
      out.push_back(std::move(e));
      break;
    }
    return out;
  }

  if (target_box.rank() != v.shape.size() || !Contains(Box::Whole(v.shape), target_box)) {
    return InvalidArgumentError("AOA: query box " + target_box.ToString() + " is not inside " +
                                Quote(model_key) + " of shape " + ShapeStr(v.shape));
  }
  if (target_box.empty()) return out;
  const bool state = !suffix.empty();
  const DType state_dtype = state ? m.StateDType(model_key, v, suffix) : v.dtype;
  std::vector<Slice> pieces;
  for (const Slice& s : v.slices) {
    std::optional<Box> inter = Intersect(s.dst, target_box);
    if (!inter) continue;
    Box rel = *inter;
    for (size_t i = 0; i < rel.rank(); ++i) rel.global_offset[i] -= s.dst.global_offset[i];
    pieces.clear();
    internal::RestrictAll(s, rel, &pieces);
    for (Slice& p : pieces) {
      const SourceInfo& src = m.sources[p.source];
      ShardMapping e;
      e.target_box = std::move(p.dst);
      if (src.fill) {
        e.kind = MappingKind::kFill;
        e.fill_value = src.fill_value;
        e.result_dtype = state ? state_dtype : v.dtype;
        out.push_back(std::move(e));
        continue;
      }
      e.kind = MappingKind::kCopy;
      e.source_box = std::move(p.src);
      e.ops = internal::ToPostOps(p.ops);
      if (!state) {
        if (!src.stored) {
          return NotFoundError("AOA: " + Quote(target_key) + " needs source tensor " +
                               Quote(src.key) + ", which the checkpoint does not hold (it holds "
                               "only optimizer states for it)");
        }
        e.source_key = src.key;
        e.source_shape = src.shape;
        e.source_dtype = src.dtype;
        e.result_dtype = DTypeAfter(e.ops, src.dtype);
      } else {
        e.source_key = src.key + std::string(suffix);
        const TensorMeta* meta = m.source_dir->Find(e.source_key);
        if (meta == nullptr) {
          return NotFoundError("AOA: " + Quote(target_key) + " needs source tensor " +
                               Quote(e.source_key) + ", which the checkpoint does not hold");
        }
        if (meta->shape != src.shape) {
          return InvalidArgumentError("AOA: optimizer state " + Quote(e.source_key) +
                                      " has shape " + ShapeStr(meta->shape) +
                                      " but its parameter has shape " + ShapeStr(src.shape));
        }
        e.source_shape = meta->shape;
        e.source_dtype = *meta->dtype;
        // States keep their stored type: the statements' casts are for the parameters.
        std::erase_if(e.ops, [](const PostOp& op) { return std::holds_alternative<Cast>(op); });
        if (state_dtype != e.source_dtype) e.ops.push_back(Cast{state_dtype});
        e.result_dtype = state_dtype;
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<OutputTensor> AoaEngine::ListOutputs(bool with_states) const {
  const Impl& m = *impl_;
  std::vector<OutputTensor> out;
  for (const OutputTensor& o : m.output_list) {
    if (m.dest_dir || !o.has_data) {
      out.push_back(o);
      continue;
    }
    const Var& v = m.vars[m.outputs.at(o.key)];
    const std::vector<int> srcs = m.SourcesOf(v);
    bool stored = true;
    for (int s : srcs) stored &= m.sources[s].stored;
    if (stored) out.push_back(o);
    if (!with_states) continue;
    for (const std::string& suffix : m.options.state_suffixes.suffixes) {
      bool all = !srcs.empty();
      for (int s : srcs) all &= m.source_dir->Find(m.sources[s].key + suffix) != nullptr;
      if (all) out.push_back(OutputTensor{o.key + suffix, v.shape, m.StateDType(o.key, v, suffix), true});
    }
    for (const std::string& suffix : m.options.state_suffixes.scalar_suffixes) {
      for (int s : srcs) {
        if (const TensorMeta* t = m.source_dir->Find(m.sources[s].key + suffix)) {
          out.push_back(OutputTensor{o.key + suffix, t->shape, *t->dtype, true});
          break;
        }
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const OutputTensor& a, const OutputTensor& b) { return a.key < b.key; });
  return out;
}

Result<OutputTensor> AoaEngine::Output(std::string_view key) const {
  const Impl& m = *impl_;
  auto it = std::lower_bound(m.output_list.begin(), m.output_list.end(), key,
                             [](const OutputTensor& a, std::string_view k) { return a.key < k; });
  if (it != m.output_list.end() && it->key == key) return *it;
  SplitKey split = SplitStateSuffix(key, m.options.state_suffixes);
  if (!split.suffix.empty()) {
    auto o = m.outputs.find(std::string(split.model_key));
    if (o != m.outputs.end() && o->second >= 0) {
      const Var& v = m.vars[o->second];
      const std::string model(split.model_key);
      if (split.scalar) {
        for (int s : m.SourcesOf(v)) {
          if (const TensorMeta* t = m.source_dir->Find(m.sources[s].key + std::string(split.suffix))) {
            return OutputTensor{std::string(key), t->shape, *t->dtype, true};
          }
        }
      } else {
        return OutputTensor{std::string(key), v.shape, m.StateDType(model, v, split.suffix), true};
      }
    }
  }
  return NotFoundError("AOA: no output tensor " + Quote(key));
}

std::vector<std::string> AoaEngine::ExpandedStatements() const {
  std::vector<std::string> out;
  out.reserve(impl_->expansion.statements.size());
  for (const ExpandedStatement& s : impl_->expansion.statements) out.push_back(s.statement.ToString());
  return out;
}

std::vector<std::string> AoaEngine::ExecutedStatements() const {
  std::vector<std::string> out;
  out.reserve(impl_->executed.size());
  for (const Statement& s : impl_->executed) out.push_back(s.ToString());
  return out;
}

const std::vector<std::string>& AoaEngine::warnings() const { return impl_->warnings; }

}  // namespace fc::aoa
