#include "fc/aoa/provenance.h"

#include <algorithm>

namespace fc::aoa {
namespace {

constexpr size_t kMaxShown = 240;

std::string Shorten(const std::string& text) {
  if (text.size() <= kMaxShown) return text;
  const size_t keep = kMaxShown / 2 - 10;
  return text.substr(0, keep) + " ... (" + std::to_string(text.size()) + " characters) ... " +
         text.substr(text.size() - keep);
}

}  // namespace

Provenance::Provenance(const AoaProgram& program) : source_name_(program.source_name) {
  statement_lines_.reserve(program.statements.size());
  nodes_.reserve(program.statements.size());
  roots_.assign(program.statements.size(), -1);
  for (size_t i = 0; i < program.statements.size(); ++i) {
    statement_lines_.push_back(program.statements[i].line);
    roots_[i] = static_cast<int>(nodes_.size());
    nodes_.push_back(Node{-1, static_cast<int>(i), "", program.statements[i].text});
  }
}

int Provenance::Root(int statement_index) { return roots_.at(statement_index); }

int Provenance::AddChild(int parent, std::string_view macro, std::string text) {
  nodes_.push_back(Node{parent, nodes_[parent].statement, std::string(macro), std::move(text)});
  return static_cast<int>(nodes_.size()) - 1;
}

int Provenance::StatementIndex(int node) const { return nodes_[node].statement; }

int Provenance::Line(int node) const { return statement_lines_[nodes_[node].statement]; }

std::string Provenance::Location(int node) const {
  return FormatLocation(source_name_, Line(node));
}

std::string Provenance::Describe(int node) const {
  std::vector<int> chain;
  for (int n = node; n >= 0; n = nodes_[n].parent) chain.push_back(n);
  std::reverse(chain.begin(), chain.end());
  std::string out;
  for (int n : chain) {
    if (!out.empty()) out += '\n';
    if (nodes_[n].parent < 0) {
      out += "  statement: ";
    } else {
      out += "  after " + nodes_[n].macro + ": ";
    }
    out += Shorten(nodes_[n].text);
  }
  return out;
}

Status Provenance::Error(int node, std::string_view message) const {
  return InvalidArgumentError(FormatLocation(source_name_, Line(node)) + ": " +
                              std::string(message) + "\n" + Describe(node));
}

Status Provenance::Wrap(int node, const Status& status) const {
  if (status.ok()) return status;
  return Status(status.code(), FormatLocation(source_name_, Line(node)) + ": " +
                                   status.message() + "\n" + Describe(node));
}

}  // namespace fc::aoa
