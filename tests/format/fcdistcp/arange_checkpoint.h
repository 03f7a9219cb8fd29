// A float32 fc distcp checkpoint whose value at each flat index is that index, cut into the
// boxes a test chooses: for executor and planner tests that check where every byte went.
// Header-only (Catch2 assertions); include as "tests/format/fcdistcp/arange_checkpoint.h".
#ifndef FC_TESTS_FORMAT_FCDISTCP_ARANGE_CHECKPOINT_H_
#define FC_TESTS_FORMAT_FCDISTCP_ARANGE_CHECKPOINT_H_

#include <catch2/catch.hpp>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/format/fc_distcp.h"

namespace fc::testing {

// How the boxes of WriteArangeCheckpoint lie in files.
enum class ArangeFiles { kOneFile, kFilePerBox };

// Writes float32 tensor `key` of `shape` with value i at flat index i to `dir`, one chunk per
// box (all in one file, or box c alone in file c), and returns the checkpoint read back.
inline CheckpointIndex WriteArangeCheckpoint(const std::string& dir, const std::string& key,
                                             const Shape& shape, const std::vector<Box>& boxes,
                                             ArangeFiles files) {
  const bool per_box = files == ArangeFiles::kFilePerBox;
  FcDistcpPlan plan;
  plan.tensors.push_back({key, DType::kFloat32, shape});
  const size_t file_count = per_box ? boxes.size() : 1;
  for (size_t f = 0; f < file_count; ++f) {
    plan.files.push_back({FcDistcpFileName(static_cast<int64_t>(f), 0), {}, {}});
  }
  for (size_t c = 0; c < boxes.size(); ++c) {
    plan.files[per_box ? c : 0].chunks.push_back({key, boxes[c], std::nullopt, 0});
  }
  auto writer = FcDistcpWriter::Create(dir, plan);
  REQUIRE(writer.ok());
  for (size_t c = 0; c < boxes.size(); ++c) {
    std::vector<float> data(static_cast<size_t>(boxes[c].num_elements()));
    for (int64_t i = 0; i < boxes[c].num_elements(); ++i) {
      Shape local = Unravel(i, boxes[c].local_shape);
      for (size_t a = 0; a < local.size(); ++a) local[a] += boxes[c].global_offset[a];
      data[static_cast<size_t>(i)] = static_cast<float>(Ravel(local, shape));
    }
    const auto bytes = std::as_bytes(std::span<const float>(data));
    REQUIRE((*writer)->WriteChunk(per_box ? c : 0, per_box ? 0 : c, 0, bytes).ok());
  }
  REQUIRE((*writer)->Finish().ok());
  auto index = ReadFcDistcp(dir);
  REQUIRE(index.ok());
  return std::move(index).value();
}

}  // namespace fc::testing

#endif  // FC_TESTS_FORMAT_FCDISTCP_ARANGE_CHECKPOINT_H_
