// Whitespace trimming of the one-line text files checkpoints keep beside their data
// (DeepSpeed's `latest`, Megatron's latest_checkpointed_iteration.txt): the file's text
// without leading spaces / tabs and trailing spaces, tabs, CR and LF.
#ifndef FC_CORE_TRIM_H_
#define FC_CORE_TRIM_H_

#include <string_view>

namespace fc {

// `text` without leading ' ' / '\t' and trailing ' ' / '\t' / '\r' / '\n'. Pure.
constexpr std::string_view TrimLineText(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' ||
                           text.back() == '\t')) {
    text.remove_suffix(1);
  }
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  return text;
}

}  // namespace fc

#endif  // FC_CORE_TRIM_H_
