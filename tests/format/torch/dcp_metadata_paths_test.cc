// The two paths behind ParseDcpMetadata (src/format/torch/dcp_metadata.cc): the compact
// pickle machine walked by the shared walker, and the general PickleValue tree walked by
// the same walker. On every torch DCP fixture (1.13 saves, the torch 2.x variants, per-rank
// metadata, the refused big-endian one) the compact path must succeed and give exactly
// what the general path gives, planner_data and mcore_data included; on mutated files it
// may refuse, but whatever it accepts must equal the general result.
#include <bit>
#include <filesystem>
#include <random>

#include <catch2/catch.hpp>

#include "fc/codec/pickle.h"
#include "fc/format/torch_dcp.h"
#include "src/codec/compact_pickle.h"
#include "src/format/torch/dcp_metadata_parse.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;

// Structural equality of two value trees (identity and sharing are not compared).
bool SameValue(const PickleValue* a, const PickleValue* b, int depth = 0) {
  if (a == nullptr || b == nullptr) return a == b;
  if (depth > 600) return false;
  if (a->kind != b->kind || a->str != b->str || a->name != b->name) return false;
  switch (a->kind) {
    case Kind::kBool: if (a->bool_value != b->bool_value) return false; break;
    case Kind::kInt: if (a->int_value != b->int_value) return false; break;
    case Kind::kFloat:
      if (std::bit_cast<uint64_t>(a->float_value) != std::bit_cast<uint64_t>(b->float_value)) {
        return false;
      }
      break;
    case Kind::kBytes:
      if (a->bytes_offset != b->bytes_offset || a->bytes_length != b->bytes_length) return false;
      break;
    case Kind::kSet: if (a->bool_value != b->bool_value) return false; break;
    default: break;
  }
  if (a->items.size() != b->items.size() || a->entries.size() != b->entries.size()) return false;
  for (size_t i = 0; i < a->items.size(); ++i) {
    if (!SameValue(a->items[i].get(), b->items[i].get(), depth + 1)) return false;
  }
  for (size_t i = 0; i < a->entries.size(); ++i) {
    if (!SameValue(a->entries[i].first.get(), b->entries[i].first.get(), depth + 1) ||
        !SameValue(a->entries[i].second.get(), b->entries[i].second.get(), depth + 1)) {
      return false;
    }
  }
  return SameValue(a->callee.get(), b->callee.get(), depth + 1) &&
         SameValue(a->args.get(), b->args.get(), depth + 1) &&
         SameValue(a->kwargs.get(), b->kwargs.get(), depth + 1) &&
         SameValue(a->state.get(), b->state.get(), depth + 1);
}

// Every field of two parsed .metadata files; the first difference is reported.
void CheckSameMetadata(const DcpMetadata& a, const DcpMetadata& b) {
  CHECK(a.generation == b.generation);
  REQUIRE(a.items.size() == b.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    const DcpItemMetadata &x = a.items[i], &y = b.items[i];
    INFO("item " << x.fqn);
    CHECK(x.fqn == y.fqn);
    CHECK(x.is_tensor == y.is_tensor);
    CHECK(x.dtype == y.dtype);
    CHECK(x.size == y.size);
    CHECK(x.requires_grad == y.requires_grad);
    CHECK(x.memory_format == y.memory_format);
    REQUIRE(x.chunks.size() == y.chunks.size());
    for (size_t c = 0; c < x.chunks.size(); ++c) {
      CHECK(x.chunks[c].offsets == y.chunks[c].offsets);
      CHECK(x.chunks[c].sizes == y.chunks[c].sizes);
    }
  }
  REQUIRE(a.storage.size() == b.storage.size());
  for (size_t i = 0; i < a.storage.size(); ++i) {
    const DcpStorageInfo &x = a.storage[i], &y = b.storage[i];
    INFO("storage entry " << i << " " << x.fqn);
    CHECK(x.fqn == y.fqn);
    CHECK(x.chunk_offsets == y.chunk_offsets);
    CHECK(x.index == y.index);
    CHECK(x.relative_path == y.relative_path);
    CHECK(x.offset == y.offset);
    CHECK(x.length == y.length);
    CHECK(x.transform_descriptors == y.transform_descriptors);
  }
  CHECK(a.version == b.version);
  CHECK(a.checkpoint_id == b.checkpoint_id);
  CHECK(a.save_id == b.save_id);
  CHECK(SameValue(a.planner_data.get(), b.planner_data.get()));
  CHECK(SameValue(a.mcore_data.get(), b.mcore_data.get()));
  CHECK(a.extra_fields == b.extra_fields);
}

std::vector<std::string> MetadataFiles() {
  std::vector<std::string> out;
  for (const char* dir : {"torch_dcp", "torch_dcp_refused"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(testing::TestdataPath(dir))) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.ends_with(".metadata")) out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_CASE("dcp metadata: the compact path equals the general path on every fixture",
          "[torch_dcp][metadata_paths]") {
  const auto files = MetadataFiles();
  REQUIRE(files.size() >= 14);  // 10 fixtures + 3 more rank_local files + big_endian
  for (const std::string& path : files) {
    INFO(path);
    const auto bytes = testing::ReadFileBytes(path);
    auto general = ParseDcpMetadataGeneral(bytes);
    REQUIRE(general.ok());
    auto compact = ParseDcpMetadataCompact(bytes);
    INFO((compact.ok() ? std::string() : compact.status().ToString()));
    REQUIRE(compact.ok());
    CheckSameMetadata(*compact, *general);
    auto dispatched = ParseDcpMetadata(bytes);
    REQUIRE(dispatched.ok());
    CheckSameMetadata(*dispatched, *general);
  }
}

TEST_CASE("dcp metadata: the compact path keeps planner_data as general values",
          "[torch_dcp][metadata_paths]") {
  // The fixtures' planner_data must really be compared (not both null everywhere).
  int with_planner_data = 0;
  for (const std::string& path : MetadataFiles()) {
    auto md = ParseDcpMetadataCompact(testing::ReadFileBytes(path));
    REQUIRE(md.ok());
    if (md->planner_data) ++with_planner_data;
  }
  CHECK(with_planner_data > 0);
}

TEST_CASE("dcp metadata: what the compact path accepts from mutated files, the general path "
          "gives too", "[torch_dcp][metadata_paths][fuzz]") {
  std::mt19937_64 rng(20261203);
  int compact_ok = 0, total = 0;
  for (const std::string& path : MetadataFiles()) {
    const auto original = testing::ReadFileBytes(path);
    for (int iter = 0; iter < 400; ++iter) {
      auto b = original;
      for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
        const size_t at = static_cast<size_t>(rng() % b.size());
        switch (rng() % 3) {
          case 0: b[at] ^= static_cast<std::byte>(1u << (rng() % 8)); break;
          case 1: b.erase(b.begin() + static_cast<std::ptrdiff_t>(at)); break;
          default: b.resize(at); break;
        }
        if (b.empty()) b.push_back(std::byte{'.'});
      }
      ++total;
      auto compact = ParseDcpMetadataCompact(b);
      auto general = ParseDcpMetadataGeneral(b);
      auto dispatched = ParseDcpMetadata(b);
      // The dispatcher's answer is the general one, value or error.
      REQUIRE(dispatched.ok() == general.ok());
      if (!general.ok()) {
        CHECK(dispatched.status().ToString() == general.status().ToString());
      }
      if (!compact.ok()) continue;
      ++compact_ok;
      INFO(path << " mutation " << iter);
      REQUIRE(general.ok());
      CheckSameMetadata(*compact, *general);
    }
  }
  CHECK(compact_ok > 0);
  CHECK(compact_ok < total);
}

TEST_CASE("compact pickle: refuses what the general machine refuses", "[pickle][compact]") {
  auto parse = [](std::initializer_list<int> bytes) {
    std::vector<std::byte> b;
    for (int x : bytes) b.push_back(static_cast<std::byte>(x));
    return std::make_pair(CompactPickle::Parse(b).ok(), ParsePickle(b).ok());
  };
  // A list that contains itself: ] q0 h0 a .
  auto [c1, g1] = parse({']', 'q', 0, 'h', 0, 'a', '.'});
  CHECK_FALSE(c1);
  CHECK_FALSE(g1);
  // An undefined memo key, a stack underflow, no STOP, a non-tuple REDUCE argument.
  for (auto [c, g] : {parse({'h', 3, '.'}), parse({'a', '.'}), parse({']'}),
                      parse({'N', 'N', 'R', '.'})}) {
    CHECK_FALSE(c);
    CHECK_FALSE(g);
  }
  // Depth: 600 nested lists.
  std::vector<std::byte> deep;
  for (int i = 0; i < 600; ++i) deep.push_back(std::byte{']'});
  for (int i = 0; i < 599; ++i) deep.push_back(std::byte{'a'});
  deep.push_back(std::byte{'.'});
  CHECK_FALSE(CompactPickle::Parse(deep).ok());
  CHECK_FALSE(ParsePickle(deep).ok());
  // 600 nested 1-tuples (shared by content, depth from their heights); 500 are fine.
  for (int levels : {600, 500}) {
    std::vector<std::byte> tuples{std::byte{')'}};
    for (int i = 1; i < levels; ++i) tuples.push_back(std::byte{0x85});
    tuples.push_back(std::byte{'.'});
    CHECK(CompactPickle::Parse(tuples).ok() == (levels == 500));
    CHECK(ParsePickle(tuples).ok() == (levels == 500));
  }
  // One list reached twice through the memo is a DAG, not a cycle: accepted by both.
  auto [c2, g2] = parse({']', 'q', 0, '(', 'h', 0, 'h', 0, 'l', '.'});
  CHECK(c2);
  CHECK(g2);
  // A deep nest built through the memo (GET of a list being filled) is checked in full.
  std::vector<std::byte> memo_deep{std::byte{']'}, std::byte{'q'}, std::byte{0}};
  for (int i = 0; i < 600; ++i) {
    for (int x : std::initializer_list<int>{']', 'h', 0, 'a', 'q', 0}) {
      memo_deep.push_back(static_cast<std::byte>(x));
    }
  }
  memo_deep.push_back(std::byte{'.'});
  CHECK_FALSE(CompactPickle::Parse(memo_deep).ok());
  CHECK_FALSE(ParsePickle(memo_deep).ok());
}

TEST_CASE("compact pickle: values, memo sharing and mutation seen through the memo",
          "[pickle][compact]") {
  // EMPTY_DICT MEMOIZE MARK 'k' BININT1 1 SETITEMS POP ; BINGET 0 ; STOP
  std::vector<std::byte> b;
  for (int x : std::initializer_list<int>{0x80, 4, '}', 0x94, '(', 0x8c, 1, 'k', 'K', 1, 'u',
                                          '0', 'h', 0, '.'}) {
    b.push_back(static_cast<std::byte>(x));
  }
  auto p = CompactPickle::Parse(b);
  REQUIRE(p.ok());
  const CompactPickle::Ref root = p->root();
  REQUIRE(p->kind(root) == Kind::kDict);
  REQUIRE(p->size(root) == 2);
  std::vector<CompactPickle::Ref> links;
  p->ForEachLink(root, [&](CompactPickle::Ref r) { links.push_back(r); });
  CHECK(p->str(links[0]) == "k");
  CHECK(p->int_value(links[1]) == 1);
  auto general = ParsePickle(b);
  REQUIRE(general.ok());
  auto kept = p->ToPickleValue(root, uint64_t{1} << 20);
  REQUIRE(kept.ok());
  CHECK(SameValue(kept->get(), &*general));
}

TEST_CASE("compact pickle: memo keys that double the memo are charged before it grows",
          "[pickle][compact]") {
  // None, then LONG_BINPUT with keys just inside "2 x the memo + 4096": each doubles the
  // memo, and twenty of them (a ~100-byte file) would ask for 2^32 entries (32-64 GiB).
  std::vector<std::byte> b{std::byte{0x80}, std::byte{2}, std::byte{'N'}};
  uint64_t key = 4000;
  while (key < (uint64_t{1} << 32)) {
    b.push_back(std::byte{'r'});
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::byte>((key >> (8 * i)) & 0xff));
    key = 2 * (key + 1) + 4000;
  }
  b.push_back(std::byte{'.'});
  auto compact = CompactPickle::Parse(b);
  CHECK_FALSE(compact.ok());
  auto general = ParsePickle(b);
  REQUIRE_FALSE(general.ok());
  CHECK(general.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("compact pickle: values kept as general trees stay under a byte budget",
          "[pickle][compact]") {
  // A list of 100k empty dicts: 40-byte nodes here, ~300 bytes each as PickleValues.
  std::vector<std::byte> b{std::byte{0x80}, std::byte{2}, std::byte{'('}};
  for (int i = 0; i < 100000; ++i) b.push_back(std::byte{'}'});
  b.push_back(std::byte{'l'});
  b.push_back(std::byte{'.'});
  auto p = CompactPickle::Parse(b);
  REQUIRE(p.ok());
  auto small = p->ToPickleValue(p->root(), 4u << 20);
  REQUIRE_FALSE(small.ok());
  CHECK(small.status().code() == StatusCode::kResourceExhausted);
  auto large = p->ToPickleValue(p->root(), 256u << 20);
  REQUIRE(large.ok());
  CHECK((*large)->items.size() == 100000);
}

}  // namespace
}  // namespace fc
