// Stream-transform decoding for torch DCP items. Contract: include/fc/format/torch_dcp_transform.h.
//
// torch's ZStandard extension wraps the item stream in zstd.ZstdCompressor().stream_writer:
// frames without a content size, so the decoded size is only known at the end, and the
// decoder must be driven as a stream (ZSTD_decompressStream), never with the one-shot API.
#include "fc/format/torch_dcp_transform.h"

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "fc/core/checked_math.h"

namespace fc {
namespace {

constexpr std::string_view kZstdDescriptor = "stream.zstd/1";

struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

std::string ItemRange(const RandomAccessFile& file, const EncodedItem& item) {
  return Basename(file.path()) + ": zstd item bytes [" + std::to_string(item.encoded_offset) +
         ", " + std::to_string(item.encoded_offset + item.encoded_length) + ")";
}

}  // namespace

Result<EncodedItem::Codec> CodecForTransformDescriptors(std::span<const std::string> descriptors) {
  for (const std::string& d : descriptors) {
    if (d != kZstdDescriptor) {
      return UnimplementedError("transform '" + d + "' is not supported; fc reads " +
                                std::string(kZstdDescriptor));
    }
  }
  if (descriptors.size() != 1) {
    return UnimplementedError(std::to_string(descriptors.size()) +
                              " stacked transforms are not supported; fc reads one " +
                              std::string(kZstdDescriptor));
  }
  return EncodedItem::Codec::kZstd;
}

uint64_t MaxDecodedTensorItemBytes(uint64_t tensor_bytes) {
  return CheckedAddU(tensor_bytes, kTorchSaveItemOverheadMax).value_or(UINT64_MAX);
}

Result<uint64_t> DecodeItem(const RandomAccessFile& file, const EncodedItem& item,
                            uint64_t max_decoded,
                            const std::function<bool(uint64_t, std::span<const std::byte>)>& sink) {
  auto end = CheckedAddU(item.encoded_offset, item.encoded_length);
  if (!end || *end > file.size()) {
    return DataLossError(ItemRange(file, item) + " pass the end of the file (" +
                         std::to_string(file.size()) + " bytes)");
  }
  if (item.encoded_length == 0) return DataLossError(ItemRange(file, item) + ": the item is empty");
  // A frame header that declares its content size (torch's streaming writer never does, a
  // hand-made frame may) is checked before anything is decoded or allocated.
  {
    std::byte head[18];  // ZSTD_FRAMEHEADERSIZE_MAX (a static-linking-only name)
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(sizeof(head), item.encoded_length));
    FC_RETURN_IF_ERROR(file.ReadAt(item.encoded_offset, std::span<std::byte>(head, n)));
    const unsigned long long declared = ZSTD_getFrameContentSize(head, n);
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != ZSTD_CONTENTSIZE_ERROR &&
        declared > max_decoded) {
      return DataLossError(ItemRange(file, item) + ": the zstd frame header declares " +
                           std::to_string(declared) + " decoded bytes, more than the " +
                           std::to_string(max_decoded) + " the metadata allows");
    }
  }
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx(ZSTD_createDCtx());
  if (!dctx) return ResourceExhaustedError("cannot allocate a zstd decoder");
  std::vector<std::byte> in(ZSTD_DStreamInSize());
  std::vector<std::byte> out(ZSTD_DStreamOutSize());
  uint64_t read = 0, produced = 0;
  size_t last = 0;  // ZSTD_decompressStream's hint: 0 when a frame is complete
  while (read < item.encoded_length) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(in.size(), item.encoded_length - read));
    FC_RETURN_IF_ERROR(file.ReadAt(item.encoded_offset + read, std::span<std::byte>(in.data(), n)));
    read += n;
    ZSTD_inBuffer input{in.data(), n, 0};
    // Drain this input; also keep calling while the output buffer came back full, since the
    // decoder may hold more output for the same input.
    while (true) {
      // At most one byte past the cap per call, so an overrun stops right there.
      const uint64_t left = max_decoded - produced;  // produced <= max_decoded here
      const size_t room = left >= out.size() ? out.size() : static_cast<size_t>(left + 1);
      ZSTD_outBuffer output{out.data(), room, 0};
      last = ZSTD_decompressStream(dctx.get(), &output, &input);
      if (ZSTD_isError(last)) {
        return DataLossError(ItemRange(file, item) + ": " + ZSTD_getErrorName(last) +
                             " (after " + std::to_string(produced) + " decoded bytes)");
      }
      if (output.pos > max_decoded - produced) {
        return DataLossError(ItemRange(file, item) + ": decodes to more than " +
                             std::to_string(max_decoded) +
                             " bytes, the most the metadata allows (stopped at " +
                             std::to_string(produced + output.pos) + ")");
      }
      if (output.pos > 0) {
        const bool more = sink(produced, std::span<const std::byte>(out.data(), output.pos));
        produced += output.pos;
        if (!more) return produced;
      }
      // Input used up and the decoder idle: output left room, or the frame ended exactly
      // at a full buffer (0: decoded and flushed; calling again would start a new frame).
      if (input.pos == input.size && (output.pos < output.size || last == 0)) break;
    }
  }
  if (last != 0) {
    return DataLossError(ItemRange(file, item) + ": the zstd frame is truncated (after " +
                         std::to_string(produced) + " decoded bytes)");
  }
  return produced;
}

Status ReadDecodedRange(const RandomAccessFile& file, const EncodedItem& item, uint64_t offset,
                        std::span<std::byte> dst) {
  if (dst.empty()) return Status::Ok();
  const uint64_t want_end = offset + dst.size();
  uint64_t filled = 0;
  FC_ASSIGN_OR_RETURN(
      uint64_t produced,
      // No cap needed: decoding stops at the range's end (the item's size was checked when it
      // was located or opened).
      DecodeItem(file, item, UINT64_MAX, [&](uint64_t at, std::span<const std::byte> bytes) {
        const uint64_t a = std::max(at, offset);
        const uint64_t b = std::min(at + bytes.size(), want_end);
        if (a < b) {
          std::memcpy(dst.data() + (a - offset), bytes.data() + (a - at), b - a);
          filled += b - a;
        }
        return at + bytes.size() < want_end;
      }));
  if (filled != dst.size()) {
    return DataLossError(ItemRange(file, item) + ": decoded item is " + std::to_string(produced) +
                         " bytes, read of decoded bytes [" + std::to_string(offset) + ", " +
                         std::to_string(want_end) + ") passes its end");
  }
  return Status::Ok();
}

Status DecodedItemWindows::Read(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > size || dst.size() > size - offset) {
    return DataLossError("read of decoded item bytes [" + std::to_string(offset) + ", " +
                         std::to_string(offset + dst.size()) + ") passes its end at " +
                         std::to_string(size));
  }
  if (offset + dst.size() <= head.size()) {
    std::memcpy(dst.data(), head.data() + offset, dst.size());
    return Status::Ok();
  }
  if (offset >= tail_start) {
    std::memcpy(dst.data(), tail.data() + (offset - tail_start), dst.size());
    return Status::Ok();
  }
  return UnimplementedError("the decoded item's structure lies beyond its first " +
                            std::to_string(head.size()) + " and last " +
                            std::to_string(tail.size()) + " bytes (read of [" +
                            std::to_string(offset) + ", " + std::to_string(offset + dst.size()) +
                            ") of " + std::to_string(size) + ")");
}

Result<DecodedItemWindows> DecodeItemWindows(const RandomAccessFile& file,
                                             const EncodedItem& item, uint64_t max_decoded,
                                             uint64_t head_bytes, uint64_t tail_bytes) {
  DecodedItemWindows w;
  std::vector<std::byte> tail;  // decoded [tail_begin, produced), trimmed now and then
  uint64_t tail_begin = 0;
  FC_ASSIGN_OR_RETURN(
      w.size, DecodeItem(file, item, max_decoded,
                         [&](uint64_t at, std::span<const std::byte> bytes) {
        if (at < head_bytes) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(head_bytes - at, bytes.size()));
          w.head.insert(w.head.end(), bytes.begin(), bytes.begin() + n);
        }
        tail.insert(tail.end(), bytes.begin(), bytes.end());
        if (tail.size() > 2 * tail_bytes) {
          const size_t drop = tail.size() - static_cast<size_t>(tail_bytes);
          tail.erase(tail.begin(), tail.begin() + drop);
          tail_begin += drop;
        }
        return true;
      }));
  if (tail.size() > tail_bytes) {
    const size_t drop = tail.size() - static_cast<size_t>(tail_bytes);
    tail.erase(tail.begin(), tail.begin() + drop);
    tail_begin += drop;
  }
  w.tail = std::move(tail);
  w.tail_start = tail_begin;
  return w;
}

}  // namespace fc
