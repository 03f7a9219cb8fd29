// Provenance: where each expanded statement came from, for error messages.
//
// Every statement the engine runs descends from one statement of the AOA file through a
// chain of macro expansions. Each link is a node (parent, macro name, text). An error
// raised for a node names the file and line of the original statement, the statement as
// written, and every expansion step down to the failing statement:
//
//   model.aoa:7: cannot split 'w' (shape [8, 12]) into 5 equal pieces along axis 1
//     statement: layers.$LAYER_ID.w -> q, k, v, fused_qkv, num_heads=4, ...
//     after $LAYER_ID: layers.0.w -> q, k, v, fused_qkv, num_heads=4, ...
//     after fused_qkv: layers.0.w -> q0, q1, q2, q3, k0, v0, axis=1
//
// Very long texts are shortened in the middle ("... (N characters) ...").
//
// Thread-safety: not thread-safe for writes; const methods may be called concurrently.
#ifndef FC_AOA_PROVENANCE_H_
#define FC_AOA_PROVENANCE_H_

#include <string>
#include <string_view>
#include <vector>

#include "fc/aoa/program.h"
#include "fc/core/status.h"

namespace fc::aoa {

class Provenance {
 public:
  Provenance() = default;
  // Copies the statements' texts and lines of `program`.
  explicit Provenance(const AoaProgram& program);

  // The node of original statement `statement_index` (created once, then reused).
  int Root(int statement_index);
  // A node for `text`, produced from `parent` by `macro`.
  int AddChild(int parent, std::string_view macro, std::string text);

  // The original statement's index, and its line.
  int StatementIndex(int node) const;
  int Line(int node) const;
  // "file:line" (or "line N") of the node's original statement.
  std::string Location(int node) const;
  const std::string& Text(int node) const { return nodes_[node].text; }
  // The node this one was expanded from (-1 for a root), and the macro that did it.
  int Parent(int node) const { return nodes_[node].parent; }
  const std::string& Macro(int node) const { return nodes_[node].macro; }

  // The traceback of `node` (the lines after the first one in the example above).
  std::string Describe(int node) const;
  // kInvalidArgument "<file>:<line>: <message>\n<Describe(node)>".
  Status Error(int node, std::string_view message) const;
  // Prepends the same location and appends the traceback to an existing error's message.
  Status Wrap(int node, const Status& status) const;

 private:
  struct Node {
    int parent = -1;
    int statement = 0;
    std::string macro;  // empty for a root
    std::string text;
  };
  std::string source_name_;
  std::vector<int> statement_lines_;
  std::vector<int> roots_;
  std::vector<Node> nodes_;
};

}  // namespace fc::aoa

#endif  // FC_AOA_PROVENANCE_H_
