// ZIP directory reader. Layout and contract: include/fc/codec/zip.h.
//
// Only what torch.save archives need: STORED entries, zip64, no multi-disk. The reader is
// strict about anything that would make a byte range lie (offsets, sizes, overlaps) and
// lenient about the rest (versions, timestamps, CRCs, which it does not check: checking
// a CRC means reading the whole record, which the callers never want to do here).
#include "fc/codec/zip.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "fc/core/checked_math.h"

namespace fc {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEocdSize = 22;
constexpr size_t kZip64EocdSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint64_t kMaxTailBytes = kEocdSize + 0xffff;

uint16_t U16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t U32(const std::byte* p) {
  return static_cast<uint32_t>(U16(p)) | (static_cast<uint32_t>(U16(p + 2)) << 16);
}
uint64_t U64(const std::byte* p) {
  return static_cast<uint64_t>(U32(p)) | (static_cast<uint64_t>(U32(p + 4)) << 32);
}

std::string Range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// Archive bytes served from the tail buffer when possible, from `read` otherwise.
class TailCache {
 public:
  TailCache(const ZipReadFn& read, uint64_t archive_size)
      : read_(read), archive_size_(archive_size) {}

  Status LoadTail(uint64_t n) {
    n = std::min(n, archive_size_);
    tail_offset_ = archive_size_ - n;
    tail_.resize(static_cast<size_t>(n));
    return read_(tail_offset_, tail_);
  }
  const std::vector<std::byte>& tail() const { return tail_; }
  uint64_t tail_offset() const { return tail_offset_; }

  // Bytes [offset, offset + n) of the archive; the caller has checked the range.
  Result<std::vector<std::byte>> Read(uint64_t offset, uint64_t n) {
    std::vector<std::byte> out(static_cast<size_t>(n));
    if (n == 0) return out;  // e.g. an empty central directory (memcpy of null is UB)
    if (offset >= tail_offset_) {
      std::memcpy(out.data(), tail_.data() + (offset - tail_offset_), out.size());
    } else {
      FC_RETURN_IF_ERROR(read_(offset, out));
    }
    return out;
  }

 private:
  const ZipReadFn& read_;
  uint64_t archive_size_;
  uint64_t tail_offset_ = 0;
  std::vector<std::byte> tail_;
};

// Position of the EOCD record inside `tail`, or -1. Scans backwards so that a comment that
// happens to contain the signature does not win over the real record.
int64_t FindEocd(const std::vector<std::byte>& tail) {
  if (tail.size() < kEocdSize) return -1;
  for (size_t i = tail.size() - kEocdSize + 1; i-- > 0;) {
    if (U32(tail.data() + i) != kEocdSig) continue;
    const uint64_t comment = U16(tail.data() + i + 20);
    if (i + kEocdSize + comment <= tail.size()) return static_cast<int64_t>(i);
  }
  return -1;
}

struct CentralInfo {
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_limit = 0;  // where the central directory must end (the next record)
  bool zip64 = false;
};

Result<CentralInfo> ReadEnd(TailCache& cache, uint64_t archive_size, uint64_t first_tail_bytes) {
  if (archive_size < kEocdSize) {
    return DataLossError("zip: archive of " + std::to_string(archive_size) +
                         " bytes is too small for an end-of-central-directory record");
  }
  FC_RETURN_IF_ERROR(cache.LoadTail(std::max<uint64_t>(first_tail_bytes, kEocdSize)));
  int64_t pos = FindEocd(cache.tail());
  if (pos < 0 && archive_size > cache.tail().size()) {
    FC_RETURN_IF_ERROR(cache.LoadTail(kMaxTailBytes));
    pos = FindEocd(cache.tail());
  }
  if (pos < 0) {
    return DataLossError("zip: no end-of-central-directory record (signature PK\\5\\6) in "
                         "the last " + std::to_string(cache.tail().size()) + " bytes");
  }
  const std::byte* e = cache.tail().data() + pos;
  const uint64_t eocd_offset = cache.tail_offset() + static_cast<uint64_t>(pos);
  CentralInfo info;
  const uint16_t disk = U16(e + 4), cd_disk = U16(e + 6);
  info.entries = U16(e + 10);
  info.cd_size = U32(e + 12);
  info.cd_offset = U32(e + 16);
  info.cd_limit = eocd_offset;

  if (eocd_offset >= kZip64LocatorSize) {
    FC_ASSIGN_OR_RETURN(auto loc, cache.Read(eocd_offset - kZip64LocatorSize, kZip64LocatorSize));
    if (U32(loc.data()) == kZip64LocatorSig) {
      const uint64_t z_offset = U64(loc.data() + 8);
      const uint32_t disks = U32(loc.data() + 16);
      if (U32(loc.data() + 4) != 0 || disks > 1) {
        return UnimplementedError("zip: multi-disk archives are not supported (" +
                                  std::to_string(disks) + " disks)");
      }
      auto z_end = CheckedAddU(z_offset, kZip64EocdSize);
      if (!z_end || *z_end > eocd_offset - kZip64LocatorSize) {
        return DataLossError("zip: zip64 end-of-central-directory offset " +
                             std::to_string(z_offset) + " is outside the archive (" +
                             std::to_string(archive_size) + " bytes)");
      }
      FC_ASSIGN_OR_RETURN(auto z, cache.Read(z_offset, kZip64EocdSize));
      if (U32(z.data()) != kZip64EocdSig) {
        return DataLossError("zip: bad zip64 end-of-central-directory signature at offset " +
                             std::to_string(z_offset));
      }
      if (U32(z.data() + 16) != 0 || U32(z.data() + 20) != 0) {
        return UnimplementedError("zip: multi-disk archives are not supported");
      }
      info.entries = U64(z.data() + 32);
      info.cd_size = U64(z.data() + 40);
      info.cd_offset = U64(z.data() + 48);
      info.cd_limit = z_offset;
      info.zip64 = true;
      return info;
    }
  }
  if (disk != 0 || cd_disk != 0) {
    return UnimplementedError("zip: multi-disk archives are not supported");
  }
  if (info.entries == 0xffff || info.cd_size == 0xffffffff || info.cd_offset == 0xffffffff) {
    return DataLossError("zip: end-of-central-directory record needs zip64 values but the "
                         "zip64 locator is missing");
  }
  return info;
}

// Applies the zip64 extended-information extra field to saturated central values.
Status ApplyZip64Extra(std::span<const std::byte> extra, ZipEntry* e, const std::string& name) {
  size_t i = 0;
  while (i + 4 <= extra.size()) {
    const uint16_t id = U16(extra.data() + i);
    const uint16_t len = U16(extra.data() + i + 2);
    if (i + 4 + len > extra.size()) {
      return DataLossError("zip: entry '" + name + "': extra field overruns its area");
    }
    if (id == 0x0001) {
      const std::byte* p = extra.data() + i + 4;
      size_t left = len;
      auto take = [&](uint64_t* field) -> Status {
        if (*field != 0xffffffff) return Status::Ok();
        if (left < 8) {
          return DataLossError("zip: entry '" + name + "': zip64 extra field too short");
        }
        *field = U64(p);
        p += 8;
        left -= 8;
        return Status::Ok();
      };
      FC_RETURN_IF_ERROR(take(&e->uncompressed_size));
      FC_RETURN_IF_ERROR(take(&e->compressed_size));
      FC_RETURN_IF_ERROR(take(&e->local_header_offset));
      return Status::Ok();
    }
    i += 4 + len;
  }
  if (e->uncompressed_size == 0xffffffff || e->compressed_size == 0xffffffff ||
      e->local_header_offset == 0xffffffff) {
    return DataLossError("zip: entry '" + name +
                         "' has saturated 32-bit fields but no zip64 extra field");
  }
  return Status::Ok();
}

}  // namespace

const ZipEntry* ZipDirectory::Find(std::string_view name) const {
  for (const ZipEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Result<ZipDirectory> ReadZipDirectory(uint64_t archive_size, const ZipReadFn& read,
                                      const ZipLimits& limits) {
  TailCache cache(read, archive_size);
  FC_ASSIGN_OR_RETURN(CentralInfo info, ReadEnd(cache, archive_size, limits.first_tail_bytes));

  auto cd_end = CheckedAddU(info.cd_offset, info.cd_size);
  if (!cd_end || *cd_end > info.cd_limit) {
    return DataLossError("zip: central directory " +
                         Range(info.cd_offset, info.cd_offset + info.cd_size) +
                         " passes its end record at " + std::to_string(info.cd_limit));
  }
  if (info.entries > limits.max_entries || info.cd_size > limits.max_central_directory_bytes) {
    return DataLossError("zip: central directory of " + std::to_string(info.entries) +
                         " entries / " + std::to_string(info.cd_size) +
                         " bytes exceeds the reader's limits");
  }
  auto min_cd = CheckedMulU(info.entries, kCentralHeaderSize);
  if (!min_cd || *min_cd > info.cd_size) {
    return DataLossError("zip: " + std::to_string(info.entries) + " entries cannot fit in a " +
                         std::to_string(info.cd_size) + "-byte central directory");
  }
  FC_ASSIGN_OR_RETURN(auto cd, cache.Read(info.cd_offset, info.cd_size));

  ZipDirectory dir;
  dir.archive_size = archive_size;
  dir.central_directory_offset = info.cd_offset;
  dir.zip64 = info.zip64;
  dir.entries.reserve(static_cast<size_t>(info.entries));
  std::unordered_set<std::string> names;
  size_t p = 0;
  for (uint64_t n = 0; n < info.entries; ++n) {
    if (p + kCentralHeaderSize > cd.size()) {
      return DataLossError("zip: central directory ends inside entry " + std::to_string(n));
    }
    const std::byte* h = cd.data() + p;
    if (U32(h) != kCentralSig) {
      return DataLossError("zip: bad central directory signature for entry " +
                           std::to_string(n) + " at offset " +
                           std::to_string(info.cd_offset + p));
    }
    ZipEntry e;
    e.flags = U16(h + 8);
    e.method = U16(h + 10);
    e.crc32 = U32(h + 16);
    e.compressed_size = U32(h + 20);
    e.uncompressed_size = U32(h + 24);
    const size_t name_len = U16(h + 28), extra_len = U16(h + 30), comment_len = U16(h + 32);
    const uint16_t disk = U16(h + 34);
    e.local_header_offset = U32(h + 42);
    if (p + kCentralHeaderSize + name_len + extra_len + comment_len > cd.size()) {
      return DataLossError("zip: central directory entry " + std::to_string(n) +
                           " overruns the directory");
    }
    e.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    FC_RETURN_IF_ERROR(ApplyZip64Extra(
        std::span<const std::byte>(h + kCentralHeaderSize + name_len, extra_len), &e, e.name));
    if (disk != 0 && disk != 0xffff) {
      return UnimplementedError("zip: multi-disk archives are not supported");
    }
    if ((e.flags & 0x1) != 0) {
      return UnimplementedError("zip: entry '" + e.name + "' is encrypted");
    }
    if (!names.insert(e.name).second) {
      return DataLossError("zip: duplicate entry '" + e.name + "'");
    }
    p += kCentralHeaderSize + name_len + extra_len + comment_len;
    dir.entries.push_back(std::move(e));
  }

  // Resolve data offsets from the local headers.
  for (ZipEntry& e : dir.entries) {
    auto lh_end = CheckedAddU(e.local_header_offset, kLocalHeaderSize + e.name.size());
    if (!lh_end || *lh_end > info.cd_offset) {
      return DataLossError("zip: entry '" + e.name + "': local header offset " +
                           std::to_string(e.local_header_offset) +
                           " is not before the central directory at " +
                           std::to_string(info.cd_offset));
    }
    FC_ASSIGN_OR_RETURN(auto lh,
                        cache.Read(e.local_header_offset, kLocalHeaderSize + e.name.size()));
    if (U32(lh.data()) != kLocalHeaderSig) {
      return DataLossError("zip: entry '" + e.name + "': bad local header signature at offset " +
                           std::to_string(e.local_header_offset));
    }
    const uint64_t lname = U16(lh.data() + 26), lextra = U16(lh.data() + 28);
    if (lname != e.name.size() ||
        std::memcmp(lh.data() + kLocalHeaderSize, e.name.data(), e.name.size()) != 0) {
      return DataLossError("zip: entry '" + e.name + "': local header at offset " +
                           std::to_string(e.local_header_offset) + " names another entry");
    }
    e.data_offset = e.local_header_offset + kLocalHeaderSize + lname + lextra;
    auto data_end = CheckedAddU(e.data_offset, e.compressed_size);
    if (!data_end || *data_end > info.cd_offset) {
      return DataLossError("zip: entry '" + e.name + "': data " +
                           Range(e.data_offset, e.data_offset + e.compressed_size) +
                           " passes the central directory at " +
                           std::to_string(info.cd_offset));
    }
    if (e.method == 0 && e.compressed_size != e.uncompressed_size) {
      return DataLossError("zip: STORED entry '" + e.name + "' has compressed size " +
                           std::to_string(e.compressed_size) + " != uncompressed size " +
                           std::to_string(e.uncompressed_size));
    }
  }

  // Entries must not overlap: a lying offset would make two records share bytes.
  std::vector<const ZipEntry*> order;
  order.reserve(dir.entries.size());
  for (const ZipEntry& e : dir.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const ZipEntry* a, const ZipEntry* b) {
    return a->local_header_offset < b->local_header_offset;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->local_header_offset < order[i - 1]->data_exclusive_max()) {
      return DataLossError("zip: entries '" + order[i - 1]->name + "' and '" + order[i]->name +
                           "' overlap");
    }
  }
  return dir;
}

ZipReadFn MemoryZipReader(std::span<const std::byte> archive) {
  return [archive](uint64_t offset, std::span<std::byte> dst) -> Status {
    if (offset > archive.size() || dst.size() > archive.size() - offset) {
      return DataLossError("zip: wanted bytes " + Range(offset, offset + dst.size()) +
                           ", archive has " + std::to_string(archive.size()));
    }
    if (!dst.empty()) std::memcpy(dst.data(), archive.data() + offset, dst.size());
    return Status::Ok();
  };
}

Result<ZipDirectory> ParseZipDirectory(std::span<const std::byte> archive,
                                       const ZipLimits& limits) {
  return ReadZipDirectory(archive.size(), MemoryZipReader(archive), limits);
}

}  // namespace fc
