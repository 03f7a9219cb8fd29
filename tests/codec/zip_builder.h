// Zip archives and torch.save items built in memory for the zip / torch.save tests
// (tests/codec/zip_test.cc, tests/format/torch's zip_torch_save_test.cc and torch_refusals_test.cc): STORED or DEFLATED-flagged entries, zip64
// extras, padding and damage on request (ZipOptions), a tensor pickle and its archive.
#ifndef FC_TESTS_CODEC_ZIP_BUILDER_H_
#define FC_TESTS_CODEC_ZIP_BUILDER_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tests/format/torch/torch_test_support.h"

namespace fc::testing {

struct ZipRec {
  std::string name;
  std::vector<std::byte> data;
  uint16_t method = 0;
};

struct ZipOptions {
  bool zip64_eocd = true;     // zip64 EOCD record + locator (torch always writes them)
  bool zip64_extra = false;   // saturate CD fields and carry them in a zip64 extra field
  size_t align = 64;          // FB padding so data starts are multiples of this (0: none)
  std::string comment;
  uint16_t flags = 0x0808;
};

inline void Put(std::vector<std::byte>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(i < 8 ? v >> (8 * i) : 0));
}
inline void PutStr(std::vector<std::byte>& out, std::string_view s) {
  for (char c : s) out.push_back(static_cast<std::byte>(c));
}

// A torch-style archive: STORED records, FB padding, data descriptors, zip64 records.
inline std::vector<std::byte> BuildZip(const std::vector<ZipRec>& recs, const ZipOptions& o = {}) {
  std::vector<std::byte> out;
  std::vector<uint64_t> lho;
  for (const ZipRec& r : recs) {
    lho.push_back(out.size());
    Put(out, 0x04034b50, 4);
    Put(out, 0, 2);
    Put(out, o.flags, 2);
    Put(out, r.method, 2);
    Put(out, 0, 4);  // time, date
    Put(out, 0, 4);  // crc
    Put(out, 0, 4);  // csize
    Put(out, 0, 4);  // usize
    Put(out, r.name.size(), 2);
    size_t pad = 0;
    if (o.align > 0) {
      const size_t base = out.size() + 2 + r.name.size() + 4;
      pad = (o.align - base % o.align) % o.align;
    }
    Put(out, o.align > 0 ? 4 + pad : 0, 2);
    PutStr(out, r.name);
    if (o.align > 0) {
      PutStr(out, "FB");
      Put(out, pad, 2);
      for (size_t i = 0; i < pad; ++i) out.push_back(std::byte{'Z'});
    }
    out.insert(out.end(), r.data.begin(), r.data.end());
    Put(out, 0x08074b50, 4);
    Put(out, 0, 4);
    Put(out, r.data.size(), 8);
    Put(out, r.data.size(), 8);
  }
  const uint64_t cd_offset = out.size();
  for (size_t i = 0; i < recs.size(); ++i) {
    const ZipRec& r = recs[i];
    Put(out, 0x02014b50, 4);
    Put(out, 0x031e, 2);
    Put(out, 0x2d, 2);
    Put(out, o.flags, 2);
    Put(out, r.method, 2);
    Put(out, 0, 4);
    Put(out, 0, 4);  // crc
    const uint64_t sat = 0xffffffff;
    Put(out, o.zip64_extra ? sat : r.data.size(), 4);
    Put(out, o.zip64_extra ? sat : r.data.size(), 4);
    Put(out, r.name.size(), 2);
    Put(out, o.zip64_extra ? 28 : 0, 2);
    Put(out, 0, 2);  // comment
    Put(out, 0, 2);  // disk
    Put(out, 0, 2);
    Put(out, 0, 4);
    Put(out, o.zip64_extra ? sat : lho[i], 4);
    PutStr(out, r.name);
    if (o.zip64_extra) {
      Put(out, 1, 2);
      Put(out, 24, 2);
      Put(out, r.data.size(), 8);
      Put(out, r.data.size(), 8);
      Put(out, lho[i], 8);
    }
  }
  const uint64_t cd_size = out.size() - cd_offset;
  if (o.zip64_eocd) {
    const uint64_t z = out.size();
    Put(out, 0x06064b50, 4);
    Put(out, 44, 8);
    Put(out, 0x1e, 2);
    Put(out, 0x2d, 2);
    Put(out, 0, 4);
    Put(out, 0, 4);
    Put(out, recs.size(), 8);
    Put(out, recs.size(), 8);
    Put(out, cd_size, 8);
    Put(out, cd_offset, 8);
    Put(out, 0x07064b50, 4);
    Put(out, 0, 4);
    Put(out, z, 8);
    Put(out, 1, 4);
  }
  Put(out, 0x06054b50, 4);
  Put(out, 0, 2);
  Put(out, 0, 2);
  Put(out, recs.size(), 2);
  Put(out, recs.size(), 2);
  Put(out, cd_size, 4);
  Put(out, cd_offset, 4);
  Put(out, o.comment.size(), 2);
  PutStr(out, o.comment);
  return out;
}

inline std::vector<std::byte> Floats(std::initializer_list<float> v) {
  std::vector<std::byte> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

// data.pkl of a tensor: _rebuild_tensor_v2 (or v3 when v3_dtype is set).
inline std::vector<std::byte> TensorPickle(std::string_view storage_class, std::string_view key,
                                    int64_t numel, int64_t offset, Shape shape, Shape strides,
                                    std::string_view v3_dtype = "") {
  PickleWriter w;
  w.Proto(2).Global("torch._utils", v3_dtype.empty() ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
  w.Mark();
  w.Mark().Str("storage").Global("torch", storage_class).Str(key).Str("cpu").Int(numel);
  w.Tuple().BinPersId();
  w.Int(offset);
  w.Mark();
  for (int64_t d : shape) w.Int(d);
  w.Tuple();
  w.Mark();
  for (int64_t s : strides) w.Int(s);
  w.Tuple();
  w.Bool(false).Global("collections", "OrderedDict").EmptyTuple().Reduce();
  if (!v3_dtype.empty()) w.Global("torch", v3_dtype);
  w.Tuple().Reduce().Stop();
  return w.bytes();
}

inline std::vector<std::byte> TensorArchive(const std::vector<std::byte>& pkl,
                                     const std::vector<std::byte>& storage,
                                     const ZipOptions& o = {}) {
  return BuildZip({{"archive/data.pkl", pkl}, {"archive/data/0", storage},
                   {"archive/version", AsBytes("3\n")}},
                  o);
}

}  // namespace fc::testing

#endif  // FC_TESTS_CODEC_ZIP_BUILDER_H_
