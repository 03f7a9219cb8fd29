// Writing torch.save-style ZIP archives whose layout is fixed before any data exists, so
// that a record's data can be written straight to its final file position (and in pieces,
// in any order) while the archive's headers are produced separately. Also CRC-32 (the ZIP
// polynomial) with crc32_combine. Used by the torch writers; the reader is
// fc/codec/zip.h.
//
// Byte layout (what torch's miniz writer produces with MZ_ZIP_FLAG_WRITE_ZIP64,
// shared/reference/formats.md 3.1; all integers little-endian; offsets archive-relative):
//   for each record, in order:
//     local header   "PK\3\4" u16 needed=0 u16 flags=0x0808 u16 method=0 (STORED)
//                    u16 time=0 u16 date=0 u32 crc=0 u32 csize=0 u32 usize=0
//                    u16 name_len u16 extra_len, name, extra
//       extra = [zip64 field: 0x0001 u16 len, usize u64 + csize u64 (only when
//                size >= 0xFFFFFFFF; both hold usize and 0 as miniz writes them),
//                header offset u64 (only when the header offset >= 0xFFFFFFFF)]
//               + "FB" u16 n + n x 'Z', n chosen so that the data starts at a multiple
//                 of 64 (torch's getPadding)
//     data           size bytes
//     descriptor     "PK\7\8" u32 crc, then csize and usize: u32 each, or u64 each when
//                    the local header has a zip64 field
//   central directory, per record: "PK\1\2" u16 made_by=0 u16 needed=0 u16 flags=0x0808
//     u16 method=0 u16 time=0 u16 date=0 u32 crc u32 min(size, 0xFFFFFFFF) twice
//     u16 name_len u16 extra_len u16 comment=0 u16 disk=0 u16 int_attr=0 u32 ext_attr=0
//     u32 min(header offset, 0xFFFFFFFF), name, extra = [zip64 field: usize, csize
//     (when size >= 0xFFFFFFFF), header offset (when >= 0xFFFFFFFF)]
//   zip64 EOCD record  "PK\6\6" u64 44 u16 made_by=0x031e u16 needed=45 u32 0 u32 0
//                      u64 n u64 n u64 cd_size u64 cd_offset
//   zip64 EOCD locator "PK\6\7" u32 0 u64 zip64_eocd_offset u32 1
//   EOCD               "PK\5\6" u16 0 u16 0 u16 min(n, 0xFFFF) twice
//                      u32 min(cd_size, 0xFFFFFFFF) u32 min(cd_offset, 0xFFFFFFFF) u16 0
//
// Thread-safety: pure functions.
#ifndef FC_CODEC_ZIP_WRITER_H_
#define FC_CODEC_ZIP_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace fc::internal_torch {

// CRC-32 (ISO-HDLC / zlib crc32) of `data`, continuing from `crc` (0 to start).
uint32_t Crc32(uint32_t crc, std::span<const std::byte> data);
// The CRC-32 of A || B from crc(A), crc(B) and |B| (zlib's crc32_combine).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// The written parts of one member's data when slabs arrive in any order: begin -> {end,
// CRC-32 of [begin, end)}. Parts that touch merge (Crc32Combine), so a member written whole
// ends as one part whose CRC is the member's; nothing is read back.
struct CrcPart {
  uint64_t end;
  uint32_t crc;
};
using CrcParts = std::map<uint64_t, CrcPart>;
// Adds [begin, end) with `crc` (begin < end). When it overlaps a part already there, changes
// nothing and returns the overlapping bytes [first, last).
std::optional<std::pair<uint64_t, uint64_t>> AddCrcPart(CrcParts& parts, uint64_t begin,
                                                        uint64_t end, uint32_t crc);

struct ZipRecordSpec {
  std::string name;   // full name, e.g. "archive/data.pkl"
  uint64_t size = 0;  // record bytes
};

struct ZipRecordPlacement {
  uint64_t header_offset = 0;      // local header
  uint64_t data_offset = 0;        // first data byte (a multiple of 64)
  uint64_t descriptor_offset = 0;  // data descriptor (= data_offset + size)
  bool zip64 = false;              // the local header carries a zip64 field
};

struct ZipLayout {
  std::vector<ZipRecordSpec> records;
  std::vector<ZipRecordPlacement> placements;
  uint64_t central_directory_offset = 0;
  uint64_t central_directory_size = 0;
  uint64_t zip64_eocd_offset = 0;
  uint64_t archive_size = 0;
};

// The placement of every record and the archive size. Precondition: names shorter than
// 64 KiB; total size representable (callers bound record sizes).
ZipLayout ComputeZipLayout(std::vector<ZipRecordSpec> records);

// Local header (with name and extra) of record i: bytes [header_offset, data_offset).
std::string ZipLocalHeader(const ZipLayout& layout, size_t i);
// Data descriptor of record i: bytes [descriptor_offset, next record or directory).
std::string ZipDataDescriptor(const ZipLayout& layout, size_t i, uint32_t crc);
// Central directory, zip64 EOCD record and locator, EOCD: bytes
// [central_directory_offset, archive_size). crcs: one per record.
std::string ZipDirectoryTail(const ZipLayout& layout, std::span<const uint32_t> crcs);

}  // namespace fc::internal_torch

#endif  // FC_CODEC_ZIP_WRITER_H_
