// ZIP layout and CRC-32. Layout and contract: fc/codec/zip_writer.h.
//
// Why fc carries its own CRC-32 instead of zlib's: fc_format's link dependencies are
// declared in src/format/meson.build, shared by every format, and all that torch archives
// need from zlib is these few lines. Slicing-by-16 runs at ~2.5 GB/s per thread (zlib's
// braided CRC: ~3), and WriteChunk computes it in the writing threads, outside any lock.
// The combine step is zlib 1.2.12's x^(2^n) method: it lets slabs of a record arrive in any
// order, each CRC'd once as it is written, and be merged in O(log n) instead of re-reading
// the record.
#include "fc/codec/zip_writer.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>

namespace fc::internal_torch {
namespace {

constexpr uint32_t kPoly = 0xedb88320u;  // reflected 0x04C11DB7
constexpr uint64_t kMax32 = 0xffffffffu;
constexpr uint64_t kAlignment = 64;
constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kZip64EocdSize = 56;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kEocdSize = 22;
constexpr uint16_t kFlags = 0x0808;  // sizes in data descriptor; UTF-8 names

struct Tables {
  std::array<std::array<uint32_t, 256>, 16> t;  // slicing-by-16
  std::array<uint32_t, 32> x2n;  // x^(2^n) mod p
};

uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t.t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 16; ++s) t.t[s][i] = (t.t[s - 1][i] >> 8) ^ t.t[0][t.t[s - 1][i] & 0xff];
    }
    uint32_t p = 1u << 30;  // x^1
    t.x2n[0] = p;
    for (int n = 1; n < 32; ++n) t.x2n[n] = p = MultModP(p, p);
    return t;
  }();
  return tables;
}

void Le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Bytes of the zip64 extra field (with its 4-byte header) for a record, 0 when none.
uint64_t Zip64ExtraSize(uint64_t size, uint64_t header_offset) {
  if (size < kMax32 && header_offset < kMax32) return 0;
  return 4 + (size >= kMax32 ? 16 : 0) + (header_offset >= kMax32 ? 8 : 0);
}

void AppendZip64Extra(std::string& out, uint64_t usize, uint64_t csize, uint64_t size,
                      uint64_t header_offset) {
  const uint64_t n = Zip64ExtraSize(size, header_offset);
  if (n == 0) return;
  Le(out, 0x0001, 2);
  Le(out, n - 4, 2);
  if (size >= kMax32) {
    Le(out, usize, 8);
    Le(out, csize, 8);
  }
  if (header_offset >= kMax32) Le(out, header_offset, 8);
}

}  // namespace

uint32_t Crc32(uint32_t crc, std::span<const std::byte> data) {
  const Tables& tb = GetTables();
  const auto& t = tb.t;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  uint32_t c = ~crc;
  while (n >= 16) {
    uint32_t w[4];
    std::memcpy(w, p, 16);
    w[0] ^= c;  // little-endian host (fc targets x86-64 / aarch64 little-endian)
    c = t[15][w[0] & 0xff] ^ t[14][(w[0] >> 8) & 0xff] ^ t[13][(w[0] >> 16) & 0xff] ^
        t[12][w[0] >> 24] ^ t[11][w[1] & 0xff] ^ t[10][(w[1] >> 8) & 0xff] ^
        t[9][(w[1] >> 16) & 0xff] ^ t[8][w[1] >> 24] ^ t[7][w[2] & 0xff] ^
        t[6][(w[2] >> 8) & 0xff] ^ t[5][(w[2] >> 16) & 0xff] ^ t[4][w[2] >> 24] ^
        t[3][w[3] & 0xff] ^ t[2][(w[3] >> 8) & 0xff] ^ t[1][(w[3] >> 16) & 0xff] ^
        t[0][w[3] >> 24];
    p += 16;
    n -= 16;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // crc(A||B) = crc(A) * x^(8|B|) mod p  xor  crc(B).
  const Tables& tb = GetTables();
  uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;         // bytes -> bits: start at x^(2^3)
  for (uint64_t n = length_b; n != 0; n >>= 1, ++k) {
    if (n & 1) p = MultModP(tb.x2n[k & 31], p);
  }
  return MultModP(p, crc_a) ^ crc_b;
}

std::optional<std::pair<uint64_t, uint64_t>> AddCrcPart(CrcParts& parts, uint64_t begin,
                                                        uint64_t end, uint32_t crc) {
  auto next = parts.upper_bound(begin);
  if (next != parts.end() && next->first < end) {
    return std::make_pair(next->first, std::min(next->second.end, end));
  }
  if (next != parts.begin()) {
    auto prev = std::prev(next);
    if (prev->second.end > begin) return std::make_pair(begin, std::min(prev->second.end, end));
    if (prev->second.end == begin) {
      crc = Crc32Combine(prev->second.crc, crc, end - begin);
      begin = prev->first;
      parts.erase(prev);
    }
  }
  if (next != parts.end() && next->first == end) {
    crc = Crc32Combine(crc, next->second.crc, next->second.end - next->first);
    end = next->second.end;
    parts.erase(next);
  }
  parts.emplace(begin, CrcPart{end, crc});
  return std::nullopt;
}

ZipLayout ComputeZipLayout(std::vector<ZipRecordSpec> records) {
  ZipLayout layout;
  layout.records = std::move(records);
  uint64_t cursor = 0;
  uint64_t cd_size = 0;
  for (const ZipRecordSpec& r : layout.records) {
    assert(r.name.size() < 0xffff);
    ZipRecordPlacement p;
    p.header_offset = cursor;
    const uint64_t zip64 = Zip64ExtraSize(r.size, cursor);
    p.zip64 = zip64 != 0;
    // torch's getPadding: the data starts after the header, name, zip64 field and the
    // 4-byte "FB" field header, rounded up to 64.
    const uint64_t start = cursor + kLocalHeaderSize + r.name.size() + zip64 + 4;
    const uint64_t pad = (kAlignment - start % kAlignment) % kAlignment;
    p.data_offset = start + pad;
    p.descriptor_offset = p.data_offset + r.size;
    cursor = p.descriptor_offset + (p.zip64 ? 24 : 16);
    cd_size += kCentralHeaderSize + r.name.size() + Zip64ExtraSize(r.size, p.header_offset);
    layout.placements.push_back(p);
  }
  layout.central_directory_offset = cursor;
  layout.central_directory_size = cd_size;
  layout.zip64_eocd_offset = cursor + cd_size;
  layout.archive_size = layout.zip64_eocd_offset + kZip64EocdSize + kZip64LocatorSize + kEocdSize;
  return layout;
}

std::string ZipLocalHeader(const ZipLayout& layout, size_t i) {
  const ZipRecordSpec& r = layout.records[i];
  const ZipRecordPlacement& p = layout.placements[i];
  const uint64_t zip64 = Zip64ExtraSize(r.size, p.header_offset);
  const uint64_t fixed = kLocalHeaderSize + r.name.size() + zip64 + 4;
  const uint64_t pad = p.data_offset - p.header_offset - fixed;
  std::string out;
  out.reserve(static_cast<size_t>(p.data_offset - p.header_offset));
  Le(out, 0x04034b50, 4);
  Le(out, 0, 2);  // version needed (miniz writes 0 for STORED)
  Le(out, kFlags, 2);
  Le(out, 0, 2);  // method: STORED
  Le(out, 0, 4);  // time, date
  Le(out, 0, 4);  // crc, csize, usize: in the descriptor (flag bit 3)
  Le(out, 0, 4);
  Le(out, 0, 4);
  Le(out, r.name.size(), 2);
  Le(out, zip64 + 4 + pad, 2);
  out += r.name;
  // As miniz: the local zip64 field holds usize and a csize of 0 (not known yet to it).
  AppendZip64Extra(out, r.size, 0, r.size, p.header_offset);
  out += "FB";
  Le(out, pad, 2);
  out.append(static_cast<size_t>(pad), 'Z');
  assert(out.size() == p.data_offset - p.header_offset);
  return out;
}

std::string ZipDataDescriptor(const ZipLayout& layout, size_t i, uint32_t crc) {
  const ZipRecordSpec& r = layout.records[i];
  const ZipRecordPlacement& p = layout.placements[i];
  std::string out;
  Le(out, 0x08074b50, 4);
  Le(out, crc, 4);
  const int width = p.zip64 ? 8 : 4;
  Le(out, r.size, width);
  Le(out, r.size, width);
  return out;
}

std::string ZipDirectoryTail(const ZipLayout& layout, std::span<const uint32_t> crcs) {
  assert(crcs.size() == layout.records.size());
  std::string out;
  out.reserve(static_cast<size_t>(layout.archive_size - layout.central_directory_offset));
  for (size_t i = 0; i < layout.records.size(); ++i) {
    const ZipRecordSpec& r = layout.records[i];
    const ZipRecordPlacement& p = layout.placements[i];
    Le(out, 0x02014b50, 4);
    Le(out, 0, 2);  // made by
    Le(out, 0, 2);  // needed
    Le(out, kFlags, 2);
    Le(out, 0, 2);  // method
    Le(out, 0, 4);  // time, date
    Le(out, crcs[i], 4);
    Le(out, std::min(r.size, kMax32), 4);
    Le(out, std::min(r.size, kMax32), 4);
    Le(out, r.name.size(), 2);
    Le(out, Zip64ExtraSize(r.size, p.header_offset), 2);
    Le(out, 0, 2);  // comment
    Le(out, 0, 2);  // disk
    Le(out, 0, 2);  // internal attributes
    Le(out, 0, 4);  // external attributes
    Le(out, std::min(p.header_offset, kMax32), 4);
    out += r.name;
    AppendZip64Extra(out, r.size, r.size, r.size, p.header_offset);
  }
  assert(out.size() == layout.central_directory_size);
  const uint64_t n = layout.records.size();
  // zip64 end of central directory record.
  Le(out, 0x06064b50, 4);
  Le(out, kZip64EocdSize - 12, 8);
  Le(out, 0x031e, 2);  // made by: Unix, 3.0 (as miniz)
  Le(out, 45, 2);      // needed: 4.5 (zip64)
  Le(out, 0, 4);
  Le(out, 0, 4);
  Le(out, n, 8);
  Le(out, n, 8);
  Le(out, layout.central_directory_size, 8);
  Le(out, layout.central_directory_offset, 8);
  // zip64 locator.
  Le(out, 0x07064b50, 4);
  Le(out, 0, 4);
  Le(out, layout.zip64_eocd_offset, 8);
  Le(out, 1, 4);
  // Classic end of central directory; saturated fields defer to the zip64 record.
  Le(out, 0x06054b50, 4);
  Le(out, 0, 2);
  Le(out, 0, 2);
  Le(out, std::min<uint64_t>(n, 0xffff), 2);
  Le(out, std::min<uint64_t>(n, 0xffff), 2);
  Le(out, std::min(layout.central_directory_size, kMax32), 4);
  Le(out, std::min(layout.central_directory_offset, kMax32), 4);
  Le(out, 0, 2);
  assert(out.size() == layout.archive_size - layout.central_directory_offset);
  return out;
}

}  // namespace fc::internal_torch
