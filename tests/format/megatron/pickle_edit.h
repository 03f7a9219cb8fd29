// Test helpers for the refusal tests (issue 34 item 1): edit a parsed pickle in place and
// write it back as a protocol-2 pickle, and rewrite a torch.save zip with its data.pkl (and
// any record) changed. Used by megatron_refusals_test.cc and
// tests/format/paddle/paddle_refusals_test.cc.
//
// Editing: DeepCopy gives a tree in which no node is shared (the parser shares memoized and
// equal values), so one edit changes one place. Its nodes were made by make_shared of a
// non-const PickleValue, so M() may cast the const away.
#ifndef FC_TESTS_FORMAT_MEGATRON_PICKLE_EDIT_H_
#define FC_TESTS_FORMAT_MEGATRON_PICKLE_EDIT_H_

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/codec/pickle_build.h"
#include "fc/codec/zip.h"
#include "fc/codec/zip_writer.h"
#include "fc/format/torch_save.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc::testing {

using PV = PickleValue;

inline PV::Ptr DeepCopy(const PV& v) {
  auto out = std::make_shared<PV>();
  out->kind = v.kind;
  out->bool_value = v.bool_value;
  out->int_value = v.int_value;  // the union's widest member: also the float and offset
  out->str = v.str;
  out->name = v.name;
  out->bytes_length = v.bytes_length;
  for (const auto& i : v.items) out->items.push_back(i ? DeepCopy(*i) : nullptr);
  for (const auto& [k, x] : v.entries) {
    out->entries.emplace_back(k ? DeepCopy(*k) : nullptr, x ? DeepCopy(*x) : nullptr);
  }
  if (v.callee) out->callee = DeepCopy(*v.callee);
  if (v.args) out->args = DeepCopy(*v.args);
  if (v.kwargs) out->kwargs = DeepCopy(*v.kwargs);
  if (v.state) out->state = DeepCopy(*v.state);
  return out;
}

inline PV& M(const PV::Ptr& p) {
  REQUIRE(p != nullptr);
  return const_cast<PV&>(*p);
}

// The entries of a dict, of an OrderedDict call or of an object's dict state.
inline std::vector<std::pair<PV::Ptr, PV::Ptr>>& EntriesOf(PV& d) {
  if (d.kind == PV::Kind::kObject && d.state && d.state->kind == PV::Kind::kDict) {
    return M(d.state).entries;
  }
  return d.entries;
}

// The value slot of string key `key` (the last one), or nullptr.
inline PV::Ptr* Slot(PV& d, std::string_view key) {
  PV::Ptr* found = nullptr;
  for (auto& [k, v] : EntriesOf(d)) {
    if (k && k->kind == PV::Kind::kStr && k->str == key) found = &v;
  }
  return found;
}
inline PV::Ptr* IntSlot(PV& d, int64_t key) {
  PV::Ptr* found = nullptr;
  for (auto& [k, v] : EntriesOf(d)) {
    if (k && k->kind == PV::Kind::kInt && k->int_value == key) found = &v;
  }
  return found;
}
// The value under `key`; fails the test when absent.
inline PV& At(PV& d, std::string_view key) {
  PV::Ptr* s = Slot(d, key);
  INFO("key " << key);
  REQUIRE(s != nullptr);
  return M(*s);
}
inline PV& AtInt(PV& d, int64_t key) {
  PV::Ptr* s = IntSlot(d, key);
  INFO("key " << key);
  REQUIRE(s != nullptr);
  return M(*s);
}
inline void Set(PV& d, std::string_view key, PV::Ptr value) {
  if (PV::Ptr* s = Slot(d, key)) {
    *s = std::move(value);
  } else {
    EntriesOf(d).emplace_back(PickleStr(std::string(key)), std::move(value));
  }
}
inline void Erase(PV& d, std::string_view key) {
  auto& e = EntriesOf(d);
  const size_t before = e.size();
  std::erase_if(e, [&](const auto& kv) {
    return kv.first && kv.first->kind == PV::Kind::kStr && kv.first->str == key;
  });
  INFO("key " << key);
  REQUIRE(e.size() < before);
}
inline PV::Ptr PickleFloat(double d) {
  auto v = std::make_shared<PV>();
  v->kind = PV::Kind::kFloat;
  v->float_value = d;
  return v;
}
inline PV::Ptr PickleIntTuple(const std::vector<int64_t>& dims) {
  std::vector<PV::Ptr> items;
  for (int64_t d : dims) items.push_back(PickleInt(d));
  return PickleTuple(std::move(items));
}

// Protocol-2 opcodes for the tree (no memo: every node written where it appears).
inline void EmitNode(PickleWriter& w, const PV& v) {
  auto put_u32 = [&](uint32_t n) {
    std::byte b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
    w.Raw(b);
  };
  auto fill = [&]() {
    if (v.state) {
      EmitNode(w, *v.state);
      w.Build();
    }
    if (v.kind != PV::Kind::kList && !v.items.empty()) {
      w.Mark();
      for (const auto& i : v.items) EmitNode(w, *i);
      w.Appends();
    }
    if (v.kind != PV::Kind::kDict && !v.entries.empty()) {
      w.Mark();
      for (const auto& [k, x] : v.entries) {
        EmitNode(w, *k);
        EmitNode(w, *x);
      }
      w.SetItems();
    }
  };
  switch (v.kind) {
    case PV::Kind::kNone: w.None(); return;
    case PV::Kind::kBool: w.Bool(v.bool_value); return;
    case PV::Kind::kInt: w.Int(v.int_value); return;
    case PV::Kind::kBigInt: {
      std::vector<uint8_t> le(v.str.begin(), v.str.end());
      w.Long1(le);
      return;
    }
    case PV::Kind::kFloat: w.Float(v.float_value); return;
    case PV::Kind::kStr: w.Str(v.str); return;
    case PV::Kind::kBytes:
      REQUIRE(v.str.size() == v.bytes_length);  // parsed with the payload inline
      w.Op('B');
      put_u32(static_cast<uint32_t>(v.str.size()));
      w.Raw(std::as_bytes(std::span(v.str.data(), v.str.size())));
      return;
    case PV::Kind::kTuple:
      w.Mark();
      for (const auto& i : v.items) EmitNode(w, *i);
      w.Tuple();
      return;
    case PV::Kind::kList:
      w.EmptyList();
      if (!v.items.empty()) {
        w.Mark();
        for (const auto& i : v.items) EmitNode(w, *i);
        w.Appends();
      }
      return;
    case PV::Kind::kDict:
      w.EmptyDict();
      if (!v.entries.empty()) {
        w.Mark();
        for (const auto& [k, x] : v.entries) {
          EmitNode(w, *k);
          EmitNode(w, *x);
        }
        w.SetItems();
      }
      return;
    case PV::Kind::kGlobal: w.Global(v.str, v.name); return;
    case PV::Kind::kCall:
      EmitNode(w, *v.callee);
      if (v.args) EmitNode(w, *v.args);
      else w.EmptyTuple();
      w.Reduce();
      fill();
      return;
    case PV::Kind::kObject:
      REQUIRE(!v.kwargs);
      EmitNode(w, *v.callee);
      if (v.args) EmitNode(w, *v.args);
      else w.EmptyTuple();
      w.NewObj();
      fill();
      return;
    case PV::Kind::kPersId:
      EmitNode(w, *v.callee);
      w.BinPersId();
      return;
    case PV::Kind::kSet:
      FAIL("sets are not written by this helper");
  }
}

inline std::vector<std::byte> EncodePickle(const PV& v) {
  PickleWriter w;
  w.Proto(2);
  EmitNode(w, v);
  w.Stop();
  return w.bytes();
}

// A pickle file parsed (payloads inline) and copied for editing.
inline PV::Ptr ReadPickleFile(const std::string& path) {
  const std::vector<std::byte> bytes = ReadFileBytes(path);
  auto parsed = ParsePickle(bytes);
  INFO(path << ": " << parsed.status().message());
  REQUIRE(parsed.ok());
  return DeepCopy(*parsed);
}
inline void WritePickleFile(const std::string& path, const PV& v) {
  WriteFileBytes(path, EncodePickle(v));
}

// --- torch.save zips ---------------------------------------------------------------------

struct ZipRecords {
  std::vector<std::pair<std::string, std::vector<std::byte>>> records;  // archive order
  // The record whose name ends with `suffix` ("/data.pkl", "/data/3").
  std::vector<std::byte>& Get(std::string_view suffix) {
    for (auto& [n, b] : records) {
      if (n.ends_with(suffix)) return b;
    }
    FAIL("no record " << suffix);
    return records.front().second;
  }
  void Remove(std::string_view suffix) {
    const size_t before = records.size();
    std::erase_if(records, [&](const auto& r) { return r.first.ends_with(suffix); });
    REQUIRE(records.size() == before - 1);
  }
};

inline ZipRecords ReadZipRecords(const std::string& path) {
  const std::vector<std::byte> file = ReadFileBytes(path);
  ZipReadFn read = [&](uint64_t off, std::span<std::byte> dst) -> Status {
    if (off + dst.size() > file.size()) return DataLossError("past the end");
    std::memcpy(dst.data(), file.data() + off, dst.size());
    return Status::Ok();
  };
  auto dir = ReadZipDirectory(file.size(), read);
  REQUIRE(dir.ok());
  ZipRecords out;
  for (const ZipEntry& e : dir->entries) {
    out.records.emplace_back(e.name, std::vector<std::byte>(file.begin() + e.data_offset,
                                                            file.begin() + e.data_exclusive_max()));
  }
  return out;
}

inline void WriteZipRecords(const std::string& path, const ZipRecords& z) {
  std::vector<internal_torch::ZipRecordSpec> specs;
  for (const auto& [n, b] : z.records) specs.push_back({n, b.size()});
  const internal_torch::ZipLayout layout = internal_torch::ComputeZipLayout(specs);
  std::string out;
  std::vector<uint32_t> crcs;
  for (size_t i = 0; i < z.records.size(); ++i) {
    const auto& b = z.records[i].second;
    const uint32_t crc = internal_torch::Crc32(0, b);
    crcs.push_back(crc);
    out += internal_torch::ZipLocalHeader(layout, i);
    out.append(reinterpret_cast<const char*>(b.data()), b.size());
    out += internal_torch::ZipDataDescriptor(layout, i, crc);
  }
  out += internal_torch::ZipDirectoryTail(layout, crcs);
  REQUIRE(out.size() == layout.archive_size);
  WriteFileBytes(path, std::as_bytes(std::span(out.data(), out.size())));
}

// Rewrites the torch.save zip at `path`: `edit` gets data.pkl's tree (editable) and every
// record (data.pkl's bytes are replaced by the edited tree afterwards).
inline void RewriteTorchSave(const std::string& path,
                             const std::function<void(PV& root, ZipRecords& records)>& edit) {
  ZipRecords z = ReadZipRecords(path);
  auto parsed = ParsePickle(z.Get("/data.pkl"));
  REQUIRE(parsed.ok());
  PV::Ptr root = DeepCopy(*parsed);
  edit(M(root), z);
  z.Get("/data.pkl") = EncodePickle(*root);
  WriteZipRecords(path, z);
}

// The pieces of a pickled torch tensor (REDUCE(_rebuild_tensor_v2, (storage, offset, size,
// stride, ...)), possibly inside _rebuild_parameter): its argument tuple.
inline PV& TensorArgs(PV& t) {
  REQUIRE(t.kind == PV::Kind::kCall);
  PV* args = &M(t.args);
  if (t.CalleeGlobal()->name == "_rebuild_parameter") {
    args = &M(M(args->items[0]).args);
  }
  REQUIRE(args->items.size() >= 4);
  return *args;
}
// Sets a tensor's size and stride tuples (a view of the same storage).
inline void SetView(PV& t, const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  PV& a = TensorArgs(t);
  a.items[2] = PickleIntTuple(size);
  a.items[3] = PickleIntTuple(stride);
}
// The persistent id tuple ('storage', cls, key, location, numel) of a tensor.
inline PV& StorageId(PV& t) {
  PV& pid = M(TensorArgs(t).items[0]);
  REQUIRE(pid.kind == PV::Kind::kPersId);
  return M(pid.callee);
}
inline std::string StorageKey(PV& t) { return M(StorageId(t).items[2]).str; }

}  // namespace fc::testing

#endif  // FC_TESTS_FORMAT_MEGATRON_PICKLE_EDIT_H_
