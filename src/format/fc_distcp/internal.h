// Private pieces shared by the fc distcp sources. Not installed.
#ifndef FC_SRC_FORMAT_FC_DISTCP_INTERNAL_H_
#define FC_SRC_FORMAT_FC_DISTCP_INTERNAL_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/format/fc_distcp.h"

namespace fc::fcdistcp_internal {

// "<rank>_<id>.distcp" with canonical decimals.
bool IsWriterFileName(std::string_view name);
// "<key>@<i>" and "<key>@obj" (fc-distcp.5, section 3).
std::string ChunkEntryName(std::string_view key, size_t chunk_index);
std::string ObjectEntryName(std::string_view key);
// 16 lower-case hex digits.
std::string Hex64(uint64_t v);
// "tensor 'w' chunk [0, 2) x [0, 6)" (+ " flat [a, b)").
std::string ChunkText(const std::string& key, const Box& box,
                      const std::optional<FlatRange>& flat);

inline SafetensorsMetadata DataFileMetadata() {
  return {{"format", std::string(kFcDistcpFormatName)},
          {"version", std::to_string(kFcDistcpVersion)}};
}
inline SafetensorsWriteOptions DataFileWriteOptions() {
  SafetensorsWriteOptions o;
  o.alignment = kFcDistcpAlignment;
  o.align_each_tensor = true;
  o.atomic = false;  // the staging directory makes the whole checkpoint atomic
  return o;
}

// FcDistcpMetadataJson with the layouts already computed.
Result<std::string> MetadataJson(const FcDistcpPlan& plan,
                                 const std::vector<FcDistcpFileLayout>& layouts,
                                 std::span<const FcDistcpFileDigests> digests);

}  // namespace fc::fcdistcp_internal

#endif  // FC_SRC_FORMAT_FC_DISTCP_INTERNAL_H_
