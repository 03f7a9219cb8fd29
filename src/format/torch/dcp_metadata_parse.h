// The two paths behind ParseDcpMetadata (fc/format/torch_dcp.h), for tests and benchmarks.
// ParseDcpMetadata tries the compact one and, when it fails for any reason, returns what
// the general one gives; see src/format/torch/dcp_metadata.cc.
#ifndef FC_SRC_FORMAT_TORCH_DCP_METADATA_PARSE_H_
#define FC_SRC_FORMAT_TORCH_DCP_METADATA_PARSE_H_

#include <cstddef>
#include <span>

#include "fc/core/status.h"
#include "fc/format/torch_dcp.h"

namespace fc {

// The reference: ParsePickle's value tree, walked. Its errors are ParseDcpMetadata's.
Result<DcpMetadata> ParseDcpMetadataGeneral(std::span<const std::byte> bytes);
// CompactPickle's flat tree, walked by the same code. An error here means only "not decoded
// this way" (its messages are not meant for users).
Result<DcpMetadata> ParseDcpMetadataCompact(std::span<const std::byte> bytes);

}  // namespace fc

#endif  // FC_SRC_FORMAT_TORCH_DCP_METADATA_PARSE_H_
