// Small helpers for the tools' human reports: byte counts, hex and aligned text tables.
// (JSON output uses fc/codec/json_writer.h.)
#ifndef FC_OPS_REPORT_FORMAT_H_
#define FC_OPS_REPORT_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "fc/core/human_bytes.h"  // HumanBytes, for the reports

namespace fc {

// `text` itself when it has at most `max` bytes (max >= 5), else its start and end around
// "...", `max` bytes in all: long paths in a report line that must fit a terminal.
std::string ElideMiddle(const std::string& text, size_t max);
// "a, b, c" or "a, b, c, d, e and 7 more": the first `shown` names of a list, for warnings
// that count what they name.
std::string FirstNames(const std::vector<std::string>& names, size_t shown = 5);
// "[2, 3]": a shape (or a multi-index) as the reports print it; "[]" for a scalar.
std::string ShapeText(const std::vector<int64_t>& shape);
// 16 lower-case hex digits.
std::string HexU64(uint64_t value);
// Columns padded to the widest cell; the last column is not padded.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace fc

#endif  // FC_OPS_REPORT_FORMAT_H_
