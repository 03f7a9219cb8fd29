// The master-rounds-to-model check (master_check.h).
#include "src/format/megatron/master_check.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "fc/core/checked_math.h"
#include "fc/core/dtype_convert.h"

namespace fc::megatron_internal {
namespace {

// File offset of the element at row-major position `flat` of a located tensor.
uint64_t ElementOffset(const Located& l, int64_t flat) {
  int64_t pos = 0;
  for (size_t d = l.shape.size(); d-- > 0;) {
    pos += (flat % l.shape[d]) * l.strides[d];
    flat /= l.shape[d];
  }
  return l.first + static_cast<uint64_t>(pos) * DTypeSize(l.dtype);
}

std::string Hex(uint64_t bits, size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = bytes * 2; i-- > 0;) s += kDigits[(bits >> (4 * i)) & 0xf];
  return s;
}

}  // namespace

Status CheckMasterRoundsToModel(const RandomAccessFile& optim_file, const Located& master,
                                const RandomAccessFile& model_file, const Located& model,
                                const std::string& name) {
  constexpr int64_t kEnds = 4;
  FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(model.shape));
  if (n == 0) return Status::Ok();  // nothing to compare (and no element to address)
  const size_t item = DTypeSize(model.dtype);
  // [first, first + count) runs: the head, and the tail when it does not overlap it.
  std::vector<std::pair<int64_t, int64_t>> runs = {{0, std::min(n, kEnds)}};
  if (n > kEnds) runs.emplace_back(std::max(kEnds, n - kEnds), n - std::max(kEnds, n - kEnds));
  for (const auto& [first, count] : runs) {
    std::array<float, kEnds> m{};
    std::array<std::byte, kEnds * 8> got{}, want{};
    const size_t c = static_cast<size_t>(count);
    FC_RETURN_IF_ERROR(optim_file.ReadAt(master.first + static_cast<uint64_t>(first) * 4,
                                         std::as_writable_bytes(std::span(m.data(), c))));
    FC_RETURN_IF_ERROR(ConvertElements(m.data(), DType::kFloat32, want.data(), model.dtype, c));
    if (model.contiguous) {
      FC_RETURN_IF_ERROR(model_file.ReadAt(ElementOffset(model, first),
                                           std::span(got.data(), c * item)));
    } else {
      for (size_t i = 0; i < c; ++i) {
        FC_RETURN_IF_ERROR(model_file.ReadAt(ElementOffset(model, first + static_cast<int64_t>(i)),
                                             std::span(got.data() + i * item, item)));
      }
    }
    for (size_t i = 0; i < c; ++i) {
      const std::byte* g = got.data() + i * item;
      const std::byte* w = want.data() + i * item;
      if (std::memcmp(g, w, item) == 0) continue;
      float back = 0;
      if (m[i] != m[i] && ConvertElements(g, model.dtype, &back, DType::kFloat32, 1).ok() &&
          back != back) {
        continue;  // NaN in both
      }
      uint64_t gb = 0, wb = 0;
      std::memcpy(&gb, g, item);
      std::memcpy(&wb, w, item);
      return DataLossError("'" + name + "' element " + std::to_string(first + static_cast<int64_t>(i)) +
                           ": the fp32 value " + FloatText(m[i]) + " rounds to " +
                           Hex(wb, item) + ", the model holds " + Hex(gb, item));
    }
  }
  return Status::Ok();
}

}  // namespace fc::megatron_internal
