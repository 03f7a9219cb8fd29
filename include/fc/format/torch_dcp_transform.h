// torch DCP stream transforms (`_StorageInfo.transform_descriptors`, torch ~2.7+,
// torch/distributed/checkpoint/_extension.py): decoding an item that was written through an
// extension stream.
//
// Byte layout: a descriptor is "name[@domain]/version". The one torch defines is ZStandard,
// "stream.zstd/1": the item's bytes [offset, offset + length) of its file are zstd frames
// (written by a streaming compressor: no content size, no checksum), which decode to the
// item as it would have been stored untransformed (a torch.save archive). Every item of such
// a save is compressed, byte items too; `length` is the compressed length. The reader applies
// the descriptors in list order; only single-transform lists occur in practice and only
// those are read.
//
// Reads of a byte range of a decoded item decompress as a stream from the item's start and
// discard everything before the range, so memory stays at zstd's window (the frame's own,
// at most 128 MiB: libzstd refuses larger windows by default) plus two 128 KiB buffers
// whatever the item's size; the price is CPU for the skipped prefix (each read of a region
// decodes the item up to the region's end).
//
// Decompression bombs: every full decoding pass is capped by what the metadata implies (a
// tensor item: its chunk's bytes + kTorchSaveItemOverheadMax for the torch.save archive
// around them; a byte item: kMaxDecodedObjectBytes, as BytesStorageMetadata carries no
// size). A first frame whose header declares a larger content size is refused before
// anything is decoded, and decoding stops at the first byte past the cap (kDataLoss naming
// the file, the item's bytes and both sizes), so a tiny item claiming or producing
// gigabytes costs neither the memory nor the time of its claim.
//
// Thread-safety: pure functions; concurrent calls on one RandomAccessFile are fine (pread).
#ifndef FC_FORMAT_TORCH_DCP_TRANSFORM_H_
#define FC_FORMAT_TORCH_DCP_TRANSFORM_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/io/file.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// The codec for a transform_descriptors list. Errors: kUnimplemented naming the descriptor
// for anything but exactly ["stream.zstd/1"] ("transform 'stream.lz4/1' is not supported;
// fc reads stream.zstd/1").
Result<EncodedItem::Codec> CodecForTransformDescriptors(std::span<const std::string> descriptors);

// Bytes a torch.save archive of one tensor may add around the tensor's data (data.pkl, the
// small records, the zip directory; ~1 KiB in practice).
inline constexpr uint64_t kTorchSaveItemOverheadMax = 64 * 1024;
// The cap for a decoded byte (BYTE_IO) item: 1 GiB.
inline constexpr uint64_t kMaxDecodedObjectBytes = uint64_t{1} << 30;
// tensor_bytes + kTorchSaveItemOverheadMax (saturating).
uint64_t MaxDecodedTensorItemBytes(uint64_t tensor_bytes);

// Streams the decoded item through `sink(decoded_offset, bytes)`, in order; the sink returns
// false to stop early. Returns the number of decoded bytes produced (all of them when not
// stopped). Errors: kDataLoss for corrupt or truncated frames ("<file>: zstd item bytes
// [a, b): <zstd error>"), for a first frame header declaring more than `max_decoded` bytes
// ("... declares 8589934592 decoded bytes, more than the 65560 the metadata allows") and for
// output past `max_decoded` ("... decodes to more than 65560 bytes, the most the metadata
// allows"), checked before the sink sees the excess; kIoError.
Result<uint64_t> DecodeItem(const RandomAccessFile& file, const EncodedItem& item,
                            uint64_t max_decoded,
                            const std::function<bool(uint64_t, std::span<const std::byte>)>& sink);

// Fills `dst` with decoded bytes [offset, offset + dst.size()). Errors: those of DecodeItem;
// kDataLoss when the decoded item ends before the range does.
Status ReadDecodedRange(const RandomAccessFile& file, const EncodedItem& item, uint64_t offset,
                        std::span<std::byte> dst);

// A decoded item seen through two windows: its first `head_bytes` and last `tail_bytes`
// (one decoding pass). Enough to parse a torch.save archive (data.pkl and the storage
// record's local header at the start, the zip directory at the end) without holding it.
struct DecodedItemWindows {
  uint64_t size = 0;  // decoded bytes
  std::vector<std::byte> head;  // decoded [0, head.size())
  uint64_t tail_start = 0;
  std::vector<std::byte> tail;  // decoded [tail_start, size)

  // Copies decoded bytes [offset, + dst.size()) when one window holds them all.
  // Errors: kDataLoss past the end; kUnimplemented when the range is in neither window.
  Status Read(uint64_t offset, std::span<std::byte> dst) const;
};
// Errors: DecodeItem's (with `max_decoded`).
Result<DecodedItemWindows> DecodeItemWindows(const RandomAccessFile& file,
                                             const EncodedItem& item, uint64_t max_decoded,
                                             uint64_t head_bytes = 256 * 1024,
                                             uint64_t tail_bytes = 256 * 1024);

}  // namespace fc

#endif  // FC_FORMAT_TORCH_DCP_TRANSFORM_H_
