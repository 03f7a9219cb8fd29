// Helpers shared by the AOA tests: building metadata, expanding programs, comparing
// statement texts with the reference's space-free spelling, and compact mapping rows.
#ifndef FC_TESTS_AOA_TEST_UTIL_H_
#define FC_TESTS_AOA_TEST_UTIL_H_

#include <optional>
#include <string>
#include <vector>

#include "fc/aoa/engine.h"
#include "fc/aoa/macros.h"
#include "fc/aoa/program.h"
#include "fc/aoa/tensor_meta.h"

namespace fc::aoa::testing {

// A tensor with `chunks` equal shards of `shape` along `axis` (1 = unsharded, no chunk list).
inline TensorMeta Meta(std::string key, Shape shape, int chunks = 1, size_t axis = 0,
                       std::optional<DType> dtype = DType::kFloat32) {
  TensorMeta m{std::move(key), dtype, shape, {}};
  if (chunks > 1) {
    const int64_t w = shape[axis] / chunks;
    for (int c = 0; c < chunks; ++c) {
      Box b = Box::Whole(shape);
      b.global_offset[axis] = c * w;
      b.local_shape[axis] = w;
      m.chunks.push_back(b);
    }
  }
  return m;
}

// Whitespace removed, double quotes made single, a trailing "\n" dropped: the reference
// concatenates tokens without spaces.
inline std::string Norm(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
    out.push_back(c == '"' ? '\'' : c);
  }
  return out;
}

inline std::vector<std::string> NormAll(const std::vector<std::string>& v) {
  std::vector<std::string> out;
  for (const std::string& s : v) out.push_back(Norm(s));
  return out;
}

inline Result<AoaProgram> Program(const std::vector<std::string>& statements, bool reverse = false) {
  return ProgramFromStatements(statements, reverse);
}

// Expands and returns each final statement normalized.
inline Result<std::vector<std::string>> ExpandTexts(
    const std::vector<std::string>& statements, const std::vector<TensorMeta>& src,
    const std::optional<std::vector<TensorMeta>>& dst = std::nullopt, bool reverse = false) {
  FC_ASSIGN_OR_RETURN(AoaProgram p, Program(statements, reverse));
  TensorDirectory sd(src, StateSuffixes{});
  std::optional<TensorDirectory> dd;
  if (dst) dd.emplace(*dst, StateSuffixes{});
  FC_ASSIGN_OR_RETURN(MacroExpansion e, ExpandMacros(p, sd, dd ? &*dd : nullptr));
  std::vector<std::string> out;
  for (const ExpandedStatement& s : e.statements) out.push_back(Norm(s.statement.ToString()));
  return out;
}

// Expands and returns, in order, the distinct texts produced by `macro` (through provenance).
inline Result<std::vector<std::string>> StageTexts(
    const std::vector<std::string>& statements, const std::vector<TensorMeta>& src,
    const std::string& macro, const std::optional<std::vector<TensorMeta>>& dst = std::nullopt,
    bool reverse = false) {
  FC_ASSIGN_OR_RETURN(AoaProgram p, Program(statements, reverse));
  TensorDirectory sd(src, StateSuffixes{});
  std::optional<TensorDirectory> dd;
  if (dst) dd.emplace(*dst, StateSuffixes{});
  FC_ASSIGN_OR_RETURN(MacroExpansion e, ExpandMacros(p, sd, dd ? &*dd : nullptr));
  std::vector<int> nodes;
  for (const ExpandedStatement& s : e.statements) {
    for (int n = s.node; n >= 0; n = e.provenance.Parent(n)) {
      if (e.provenance.Macro(n) == macro) {
        if (nodes.empty() || nodes.back() != n) nodes.push_back(n);
        break;
      }
    }
  }
  std::vector<std::string> out;
  for (int n : nodes) out.push_back(Norm(e.provenance.Text(n)));
  return out;
}

// One mapping in the reference's terms: target (local, offset) <- source key (local,
// offset) [ops].
struct Row {
  Shape target_local, target_offset;
  std::string source;
  Shape source_local, source_offset;
  std::string ops = "None";
  friend bool operator==(const Row&, const Row&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const Row& r) {
  auto v = [](const Shape& s) {
    std::string o = "(";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
    return o + ")";
  };
  return os << v(r.target_local) << "@" << v(r.target_offset) << " <- " << r.source << " "
            << v(r.source_local) << "@" << v(r.source_offset) << " " << r.ops;
}

inline Box BoxAt(Shape local, Shape offset) { return Box{std::move(offset), std::move(local)}; }

inline Result<std::vector<Row>> Query(const AoaEngine& engine, const std::string& key,
                                      Shape local, Shape offset) {
  FC_ASSIGN_OR_RETURN(std::vector<ShardMapping> ms,
                      engine.FindShardSources(key, BoxAt(local, offset)));
  std::vector<Row> rows;
  for (const ShardMapping& m : ms) {
    rows.push_back(Row{m.target_box.local_shape, m.target_box.global_offset,
                       m.kind == MappingKind::kFill ? "<fill>" : m.source_key,
                       m.source_box.local_shape, m.source_box.global_offset,
                       PostOpsToString(m.ops)});
  }
  return rows;
}

}  // namespace fc::aoa::testing

#endif  // FC_TESTS_AOA_TEST_UTIL_H_
