// Small helpers for the tools' human reports: byte counts, hex and aligned text tables.
// (JSON output uses fc/codec/json_writer.h.)
#ifndef FC_OPS_REPORT_FORMAT_H_
#define FC_OPS_REPORT_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace fc {

// "1.5 GiB", "512 B".
std::string HumanBytes(uint64_t bytes);
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
