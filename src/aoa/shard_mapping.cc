#include "fc/aoa/shard_mapping.h"

#include <sstream>

namespace fc::aoa {

std::string ShardMapping::ToString() const {
  std::ostringstream os;
  os << target_box.ToString() << " <- ";
  if (kind == MappingKind::kFill) {
    os << "fill " << fill_value << " (" << DTypeName(result_dtype) << ")";
  } else {
    os << source_key << " " << source_box.ToString() << " " << PostOpsToString(ops);
  }
  return os.str();
}

}  // namespace fc::aoa
