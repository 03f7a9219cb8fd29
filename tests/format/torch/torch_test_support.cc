#include "tests/format/torch/torch_test_support.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <catch2/catch.hpp>

#include "fc/core/dtype.h"
#include "fc/format/torch_dcp_transform.h"
#include "fc/io/file.h"
#include "tests/support/testdata.h"

namespace fc::testing {

std::string TorchFixture(const std::string& name) { return TestdataPath("torch_dcp/" + name); }

std::vector<std::byte> DcpFixtureItem(const std::string& fixture, const std::string& fqn) {
  const std::string ckpt = TorchFixture(fixture) + "/ckpt";
  auto md = ParseDcpMetadata(ReadFileBytes(ckpt + "/.metadata"));
  REQUIRE(md.ok());
  for (const DcpStorageInfo& s : md->storage) {
    if (s.fqn != fqn) continue;
    auto file = ReadFileBytes(ckpt + "/" + s.relative_path);
    REQUIRE(s.offset + s.length <= file.size());
    return std::vector<std::byte>(file.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                  file.begin() + static_cast<std::ptrdiff_t>(s.offset + s.length));
  }
  FAIL("no storage for " << fqn);
  return {};
}

std::vector<std::byte> AsBytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::vector<std::byte> Hex(std::string_view hex) {
  std::vector<std::byte> out;
  int hi = -1;
  for (char c : hex) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) continue;
    if (hi < 0) {
      hi = d;
    } else {
      out.push_back(static_cast<std::byte>(hi * 16 + d));
      hi = -1;
    }
  }
  REQUIRE(hi < 0);
  return out;
}

size_t FindBytes(std::span<const std::byte> hay, std::span<const std::byte> needle,
                 size_t from) {
  if (needle.empty() || hay.size() < needle.size()) return std::string::npos;
  for (size_t i = from; i + needle.size() <= hay.size(); ++i) {
    if (std::memcmp(hay.data() + i, needle.data(), needle.size()) == 0) return i;
  }
  return std::string::npos;
}

NpyArray ReadNpy(const std::string& path) {
  INFO(path);
  const std::vector<std::byte> b = ReadFileBytes(path);
  REQUIRE(b.size() >= 10);
  REQUIRE(std::memcmp(b.data(), "\x93NUMPY", 6) == 0);
  const int major = static_cast<int>(b[6]);
  size_t header_len = 0, pos = 0;
  if (major == 1) {
    header_len = static_cast<size_t>(b[8]) | (static_cast<size_t>(b[9]) << 8);
    pos = 10;
  } else {
    REQUIRE(b.size() >= 12);
    header_len = static_cast<size_t>(b[8]) | (static_cast<size_t>(b[9]) << 8) |
                 (static_cast<size_t>(b[10]) << 16) | (static_cast<size_t>(b[11]) << 24);
    pos = 12;
  }
  REQUIRE(pos + header_len <= b.size());
  const std::string header(reinterpret_cast<const char*>(b.data()) + pos, header_len);
  NpyArray a;
  // {'descr': '<f4', 'fortran_order': False, 'shape': (8, 6), }
  const size_t d = header.find("'descr':");
  REQUIRE(d != std::string::npos);
  const size_t q1 = header.find('\'', d + 8);
  const size_t q2 = header.find('\'', q1 + 1);
  a.descr = header.substr(q1 + 1, q2 - q1 - 1);
  REQUIRE(header.find("'fortran_order': False") != std::string::npos);
  const size_t s = header.find("'shape':");
  REQUIRE(s != std::string::npos);
  const size_t p1 = header.find('(', s);
  const size_t p2 = header.find(')', p1);
  std::string dims = header.substr(p1 + 1, p2 - p1 - 1);
  size_t i = 0;
  while (i < dims.size()) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    REQUIRE(j > i);
    a.shape.push_back(std::stoll(dims.substr(i, j - i)));
    i = j;
  }
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(pos + header_len), b.end());
  return a;
}

std::vector<std::byte> ReassembleTensor(const CheckpointIndex& index, const TensorEntry& tensor) {
  INFO("tensor " << tensor.key);
  const size_t item = DTypeSize(tensor.dtype);
  int64_t numel = 1;
  for (int64_t d : tensor.global_shape) numel *= d;
  std::vector<std::byte> out(static_cast<size_t>(numel) * item);
  std::vector<int> covered(static_cast<size_t>(numel), 0);
  const Box whole = Box::Whole(tensor.global_shape);
  const Shape global_strides = RowMajorStrides(tensor.global_shape);
  // Replicas (replica_id != 0) are written into a copy of the primaries' result, which must
  // come out unchanged; only primaries count for coverage.
  std::vector<std::byte> replicas;
  for (int pass = 0; pass < 2; ++pass) {
  if (pass == 1) replicas = out;
  for (const Chunk& c : tensor.chunks) {
    if ((c.replica_id != 0) != (pass == 1)) continue;
    INFO("chunk " << c.box.ToString() << " replica " << c.replica_id);
    REQUIRE(!c.flat_range.has_value());
    REQUIRE(c.file < index.files.size());
    // byte_length must match the layout exactly.
    uint64_t expected = 0;
    if (c.box.num_elements() > 0) {
      if (c.strides.empty()) {
        expected = static_cast<uint64_t>(c.box.num_elements()) * item;
      } else {
        REQUIRE(c.strides.size() == c.box.rank());
        uint64_t last = 0;
        for (size_t j = 0; j < c.box.rank(); ++j) {
          last += static_cast<uint64_t>(c.box.local_shape[j] - 1) *
                  static_cast<uint64_t>(c.strides[j]);
        }
        expected = (last + 1) * item;
      }
    }
    CHECK(c.byte_length == expected);
    std::vector<std::byte> file = ReadFileBytes(index.root + "/" + index.files[c.file].path);
    REQUIRE(file.size() == index.files[c.file].size);
    if (c.encoded_item) {  // the chunk's place is in the decoded item: decode it whole
      auto f = RandomAccessFile::Open(index.root + "/" + index.files[c.file].path);
      REQUIRE(f.ok());
      std::vector<std::byte> decoded;
      auto n = DecodeItem(**f, *c.encoded_item, UINT64_MAX, [&](uint64_t, std::span<const std::byte> b) {
        decoded.insert(decoded.end(), b.begin(), b.end());
        return true;
      });
      if (!n.ok()) FAIL(n.status().ToString());
      file = std::move(decoded);
    }
    REQUIRE(c.byte_offset + c.byte_length <= file.size());
    CopyRegion(file.data() + c.byte_offset, c.box, c.strides,
               pass == 0 ? out.data() : replicas.data(), whole, c.box, item);
    if (pass == 1) continue;
    // Coverage: every element of the box, once.
    const int64_t n = c.box.num_elements();
    Shape idx(c.box.rank(), 0);
    for (int64_t k = 0; k < n; ++k) {
      int64_t flat = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        flat += (c.box.global_offset[j] + idx[j]) * global_strides[j];
      }
      covered[static_cast<size_t>(flat)]++;
      for (size_t j = idx.size(); j-- > 0;) {
        if (++idx[j] < c.box.local_shape[j]) break;
        idx[j] = 0;
      }
    }
  }
  }
  CHECK((replicas.empty() || replicas == out));
  for (size_t k = 0; k < covered.size(); ++k) {
    INFO("element " << k);
    REQUIRE(covered[k] == 1);
  }
  return out;
}

// --- PickleWriter -------------------------------------------------------------------------

void PickleWriter::PutLe(uint64_t v, int n) {
  for (int i = 0; i < n; ++i) Put(static_cast<uint8_t>(v >> (8 * i)));
}
PickleWriter& PickleWriter::Proto(uint8_t p) { Put(0x80); Put(p); return *this; }
PickleWriter& PickleWriter::Frame(uint64_t n) { Put(0x95); PutLe(n, 8); return *this; }
PickleWriter& PickleWriter::Mark() { Put('('); return *this; }
PickleWriter& PickleWriter::Stop() { Put('.'); return *this; }
PickleWriter& PickleWriter::None() { Put('N'); return *this; }
PickleWriter& PickleWriter::Bool(bool b) { Put(b ? 0x88 : 0x89); return *this; }
PickleWriter& PickleWriter::Int(int64_t v) {
  if (v >= 0 && v < 256) {
    Put('K');
    PutLe(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    Put('M');
    PutLe(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    Put('J');
    PutLe(static_cast<uint64_t>(v), 4);
  } else {
    Put(0x8a);
    Put(8);
    PutLe(static_cast<uint64_t>(v), 8);
  }
  return *this;
}
PickleWriter& PickleWriter::Long1(std::span<const uint8_t> le) {
  Put(0x8a);
  Put(static_cast<uint8_t>(le.size()));
  for (uint8_t b : le) Put(b);
  return *this;
}
PickleWriter& PickleWriter::Float(double v) {
  Put('G');
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  for (int i = 7; i >= 0; --i) Put(static_cast<uint8_t>(bits >> (8 * i)));
  return *this;
}
PickleWriter& PickleWriter::Str(std::string_view s) {
  Put('X');
  PutLe(s.size(), 4);
  for (char c : s) Put(static_cast<uint8_t>(c));
  return *this;
}
PickleWriter& PickleWriter::ShortStr(std::string_view s) {
  Put(0x8c);
  Put(static_cast<uint8_t>(s.size()));
  for (char c : s) Put(static_cast<uint8_t>(c));
  return *this;
}
PickleWriter& PickleWriter::Global(std::string_view module, std::string_view name) {
  Put('c');
  for (char c : module) Put(static_cast<uint8_t>(c));
  Put('\n');
  for (char c : name) Put(static_cast<uint8_t>(c));
  Put('\n');
  return *this;
}
PickleWriter& PickleWriter::StackGlobal(std::string_view module, std::string_view name) {
  ShortStr(module);
  ShortStr(name);
  Put(0x93);
  return *this;
}
PickleWriter& PickleWriter::EmptyTuple() { Put(')'); return *this; }
PickleWriter& PickleWriter::EmptyList() { Put(']'); return *this; }
PickleWriter& PickleWriter::EmptyDict() { Put('}'); return *this; }
PickleWriter& PickleWriter::Tuple() { Put('t'); return *this; }
PickleWriter& PickleWriter::Tuple1() { Put(0x85); return *this; }
PickleWriter& PickleWriter::Tuple2() { Put(0x86); return *this; }
PickleWriter& PickleWriter::Append() { Put('a'); return *this; }
PickleWriter& PickleWriter::Appends() { Put('e'); return *this; }
PickleWriter& PickleWriter::SetItem() { Put('s'); return *this; }
PickleWriter& PickleWriter::SetItems() { Put('u'); return *this; }
PickleWriter& PickleWriter::Reduce() { Put('R'); return *this; }
PickleWriter& PickleWriter::NewObj() { Put(0x81); return *this; }
PickleWriter& PickleWriter::Build() { Put('b'); return *this; }
PickleWriter& PickleWriter::BinPersId() { Put('Q'); return *this; }
PickleWriter& PickleWriter::Memoize() { Put(0x94); return *this; }
PickleWriter& PickleWriter::BinPut(uint8_t i) { Put('q'); Put(i); return *this; }
PickleWriter& PickleWriter::BinGet(uint8_t i) { Put('h'); Put(i); return *this; }
PickleWriter& PickleWriter::Op(uint8_t op) { Put(op); return *this; }
PickleWriter& PickleWriter::Raw(std::span<const std::byte> bytes) {
  out_.insert(out_.end(), bytes.begin(), bytes.end());
  return *this;
}
PickleWriter& PickleWriter::TorchSize(std::span<const int64_t> dims) {
  Global("torch", "Size");
  Mark();
  for (int64_t d : dims) Int(d);
  Tuple();
  Tuple1();
  Reduce();
  return *this;
}

// --- DCP .metadata ------------------------------------------------------------------------

MdSpec SpecFromMetadata(const DcpMetadata& md) {
  MdSpec spec;
  spec.generation = md.generation;
  for (const DcpItemMetadata& i : md.items) {
    MdItem item;
    item.fqn = i.fqn;
    item.is_tensor = i.is_tensor;
    item.dtype = std::string(DTypeName(i.dtype));
    item.size = i.size;
    for (const auto& c : i.chunks) item.chunks.push_back({c.offsets, c.sizes});
    spec.items.push_back(std::move(item));
  }
  for (const DcpStorageInfo& s : md.storage) {
    MdStorage st;
    st.fqn = s.fqn;
    st.offset = s.chunk_offsets;
    st.index = s.index;
    st.relative_path = s.relative_path;
    st.offset_bytes = static_cast<int64_t>(s.offset);
    st.length = static_cast<int64_t>(s.length);
    st.transform_descriptors = s.transform_descriptors;
    spec.storage.push_back(std::move(st));
  }
  spec.version = md.version;
  if (md.checkpoint_id) {
    spec.checkpoint_id_parts = std::vector<std::string>{*md.checkpoint_id};
    spec.checkpoint_id_py313 = true;
  }
  spec.mcore_data = md.mcore_data != nullptr;
  return spec;
}

std::vector<std::byte> EncodeDcpMetadata(const MdSpec& spec) {
  const bool v113 = spec.generation == "1.13";
  const std::string mod = v113 ? "torch.distributed._shard.checkpoint.metadata"
                               : "torch.distributed.checkpoint.metadata";
  const std::string tp_mod = v113 ? "torch.distributed._shard.sharded_tensor.metadata" : mod;
  const std::string enum_name = v113 ? "MEM_FORMAT_ENCODING" : "_MEM_FORMAT_ENCODING";
  const std::string fs_mod = v113 ? "torch.distributed._shard.checkpoint.filesystem"
                                  : "torch.distributed.checkpoint.filesystem";
  PickleWriter w;
  w.Proto(4);
  w.StackGlobal(spec.root_module.empty() ? mod : spec.root_module, "Metadata");
  w.EmptyTuple().NewObj().EmptyDict().Mark();

  w.ShortStr("state_dict_metadata").EmptyDict().Mark();
  for (const MdItem& item : spec.items) {
    w.ShortStr(item.fqn);
    if (!item.is_tensor) {
      w.StackGlobal(mod, "BytesStorageMetadata").EmptyTuple().NewObj();
      continue;
    }
    w.StackGlobal(mod, "TensorStorageMetadata").EmptyTuple().NewObj().EmptyDict().Mark();
    w.ShortStr("properties").StackGlobal(tp_mod, "TensorProperties").EmptyTuple().NewObj();
    w.Mark().StackGlobal("torch", item.dtype);
    w.StackGlobal("torch.serialization", "_get_layout").ShortStr(item.layout).Tuple1().Reduce();
    w.Bool(false);
    if (spec.enum_by_value) {
      w.StackGlobal(tp_mod, enum_name).Int(0).Tuple1().Reduce();
    } else {
      w.StackGlobal("builtins", "getattr").StackGlobal(tp_mod, enum_name);
      w.ShortStr("TORCH_CONTIGUOUS_FORMAT").Tuple2().Reduce();
    }
    w.Bool(false).Tuple().Build();
    w.ShortStr("size").TorchSize(item.size);
    w.ShortStr("chunks").EmptyList().Mark();
    for (const MdChunk& c : item.chunks) {
      w.StackGlobal(mod, "ChunkStorageMetadata").EmptyTuple().NewObj().EmptyDict().Mark();
      w.ShortStr("offsets").TorchSize(c.offsets).ShortStr("sizes").TorchSize(c.sizes);
      w.SetItems().Build();
    }
    w.Appends();
    w.SetItems().Build();
  }
  w.SetItems();

  w.ShortStr("planner_data").None();
  w.ShortStr("storage_data");
  if (spec.storage_data_none) {
    w.None();
  } else {
    w.EmptyDict().Mark();
    for (const MdStorage& s : spec.storage) {
      w.StackGlobal(mod, "MetadataIndex").EmptyTuple().NewObj().EmptyDict().Mark();
      w.ShortStr("fqn").ShortStr(s.fqn);
      w.ShortStr("index");
      if (s.index) {
        w.Int(*s.index);
      } else {
        w.None();
      }
      if (s.offset) w.ShortStr("offset").TorchSize(*s.offset);
      w.SetItems().Build();
      w.StackGlobal(fs_mod, "_StorageInfo").EmptyTuple().NewObj().EmptyDict().Mark();
      w.ShortStr("relative_path").ShortStr(s.relative_path);
      w.ShortStr("offset").Int(s.offset_bytes);
      w.ShortStr("length");
      if (s.length_long1) {
        w.Long1(*s.length_long1);
      } else {
        w.Int(s.length);
      }
      if (!s.transform_descriptors.empty()) {
        w.ShortStr("transform_descriptors").EmptyList().Mark();
        for (const auto& t : s.transform_descriptors) w.ShortStr(t);
        w.Appends();
      }
      w.SetItems().Build();
    }
    w.SetItems();
  }
  if (spec.checkpoint_id_parts) {
    w.ShortStr("storage_meta").StackGlobal(mod, "StorageMeta").EmptyTuple().NewObj();
    w.EmptyDict().Mark().ShortStr("checkpoint_id");
    w.StackGlobal(spec.checkpoint_id_py313 ? "pathlib._local" : "pathlib", "PosixPath");
    w.Mark();
    for (const auto& p : *spec.checkpoint_id_parts) w.ShortStr(p);
    w.Tuple().Reduce();
    w.ShortStr("save_id").ShortStr("abc").ShortStr("load_id").None();
    w.ShortStr("modules").EmptyList();
    w.SetItems().Build();
  }
  if (spec.version) w.ShortStr("version").ShortStr(*spec.version);
  if (!spec.reformulated.empty()) {
    w.ShortStr("mcore_data").EmptyDict().Mark();
    for (const auto& [key, shape] : spec.reformulated) {
      w.ShortStr(key).EmptyDict().ShortStr("nd_reformulated_orig_global_shape").Mark();
      for (int64_t d : shape) w.Int(d);
      w.Tuple().SetItem();
    }
    w.SetItems();  // the mcore_data pair stays for the BUILD dict's SETITEMS
  } else if (spec.mcore_data) {
    w.ShortStr("mcore_data").EmptyDict().ShortStr("decoder.w").EmptyDict();
    w.ShortStr("nd_reformulated_orig_global_shape").Int(8).Int(4).Tuple2().SetItem().SetItem();
  }
  w.SetItems().Build().Stop();
  return w.bytes();
}

}  // namespace fc::testing
