// Byte counts for people: "512 B", "1.5 GiB" (binary units, one decimal). Every report,
// progress line and error message that shows a size uses this one spelling.
#ifndef FC_CORE_HUMAN_BYTES_H_
#define FC_CORE_HUMAN_BYTES_H_

#include <cstdint>
#include <string>

namespace fc {

std::string HumanBytes(uint64_t bytes);

}  // namespace fc

#endif  // FC_CORE_HUMAN_BYTES_H_
