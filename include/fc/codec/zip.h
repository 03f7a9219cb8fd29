// A ZIP central-directory reader for archives of STORED entries, as written by torch.save
// (miniz with zip64 enabled). Reads only the archive's tail, its central directory and one
// local header per entry; never the entry data.
//
// Byte layout (PKWARE APPNOTE 6.3; all integers little-endian; offsets are relative to the
// start of the archive, which for a torch DCP item is the item's first byte, not the file's):
//   1. entries, each:
//        local file header   "PK\3\4" u16 version u16 flags u16 method u16 time u16 date
//                            u32 crc32 u32 csize u32 usize u16 name_len u16 extra_len
//                            (30 bytes) + name + extra
//        data                csize bytes (STORED: csize == usize, the raw record)
//        [data descriptor]   "PK\7\8" crc32 csize usize (4 or 8 bytes each), when flag bit 3
//      torch pads `extra` with an "FB" field of 'Z' bytes so that every data start is a
//      multiple of 64. Sizes in the local header may be 0 (bit 3); the central directory is
//      authoritative.
//   2. central directory, per entry:
//        "PK\1\2" u16 made_by u16 needed u16 flags u16 method u16 time u16 date u32 crc32
//        u32 csize u32 usize u16 name_len u16 extra_len u16 comment_len u16 disk
//        u16 internal_attr u32 external_attr u32 local_header_offset (46 bytes)
//        + name + extra + comment
//      A field equal to 0xFFFFFFFF takes its value from the zip64 extra field (id 0x0001),
//      which lists, in this order and only for the saturated fields: usize, csize,
//      local_header_offset (u64 each), disk (u32).
//   3. [zip64 end of central directory record]  "PK\6\6" u64 record_size u16 made_by
//        u16 needed u32 disk u32 cd_disk u64 entries_on_disk u64 entries u64 cd_size
//        u64 cd_offset (56 bytes + extensible data)
//   4. [zip64 EOCD locator]  "PK\6\7" u32 disk u64 zip64_eocd_offset u32 disks (20 bytes)
//   5. end of central directory  "PK\5\6" u16 disk u16 cd_disk u16 entries_on_disk
//        u16 entries u32 cd_size u32 cd_offset u16 comment_len (22 bytes) + comment
//      torch always writes 3 and 4; when the locator is present its values are used.
//
// Entry data starts at local_header_offset + 30 + name_len + extra_len, with the lengths
// from the LOCAL header (they differ from the central ones because of the FB padding).
//
// Validation: signatures, multi-disk archives (kUnimplemented), encrypted entries
// (kUnimplemented), every offset and size inside the archive with checked arithmetic,
// entry data before the central directory, duplicate names (kDataLoss). Compressed
// entries are listed (method != 0) and refused only by callers that need their bytes.
//
// Thread-safety: pure functions; ReadZipDirectory calls `read` sequentially.
#ifndef FC_CODEC_ZIP_H_
#define FC_CODEC_ZIP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"

namespace fc {

// Reads archive bytes [offset, offset + dst.size()) into dst. Offsets are archive-relative.
// Errors are passed through unchanged.
using ZipReadFn = std::function<Status(uint64_t offset, std::span<std::byte> dst)>;

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 = STORED
  uint16_t flags = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;  // first byte of the entry data (from the local header)

  // [data_offset, data_offset + compressed_size): the record bytes of a STORED entry.
  uint64_t data_exclusive_max() const { return data_offset + compressed_size; }
};

struct ZipDirectory {
  uint64_t archive_size = 0;
  uint64_t central_directory_offset = 0;
  bool zip64 = false;  // the archive has a zip64 end-of-central-directory record
  std::vector<ZipEntry> entries;  // central directory order

  // The entry named exactly `name`, or nullptr.
  const ZipEntry* Find(std::string_view name) const;
};

struct ZipLimits {
  uint64_t max_entries = 1 << 20;
  uint64_t max_central_directory_bytes = uint64_t{256} << 20;
  // Not a limit: the size of the first read at the archive's end (at least the 22-byte
  // end-of-central-directory record). The default holds a torch.save archive's whole
  // directory; a caller that knows the directory is smaller (a small item, issue 31) asks
  // for less, and the directory is then read in a second call only when it does not fit.
  uint64_t first_tail_bytes = 4096;
};

// Reads the directory of an archive of `archive_size` bytes through `read`.
// Errors: kDataLoss for bad signatures, truncation, sizes or offsets outside the archive,
// overlapping or duplicate entries; kUnimplemented for multi-disk or encrypted archives;
// errors of `read` unchanged.
Result<ZipDirectory> ReadZipDirectory(uint64_t archive_size, const ZipReadFn& read,
                                      const ZipLimits& limits = {});

// The same over an archive held in memory.
Result<ZipDirectory> ParseZipDirectory(std::span<const std::byte> archive,
                                       const ZipLimits& limits = {});

// A ZipReadFn over memory; reads past the end are kDataLoss.
ZipReadFn MemoryZipReader(std::span<const std::byte> archive);

}  // namespace fc

#endif  // FC_CODEC_ZIP_H_
