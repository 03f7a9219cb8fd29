// Pickle VM: hand-written opcode streams, and streams produced by CPython's pickler
// (protocols 0-5 of one object) that must all decode to the same tree.
#include "fc/codec/pickle.h"
#include "fc/codec/pickle_reemit.h"
#include "fc/codec/pickle_writer.h"

#include <catch2/catch.hpp>

#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::Hex;
using testing::PickleWriter;
using Kind = PickleValue::Kind;

Result<PickleValue> Parse(const std::vector<std::byte>& b) { return ParsePickle(b); }

TEST_CASE("pickle: scalars", "[pickle]") {
  auto v = Parse(Hex("80 02 4b 07 2e"));  // PROTO 2, BININT1 7, STOP
  REQUIRE(v.ok());
  CHECK(v->kind == Kind::kInt);
  CHECK(v->int_value == 7);

  v = Parse(Hex("4a ff ff ff ff 2e"));  // BININT -1
  REQUIRE(v.ok());
  CHECK(v->int_value == -1);

  v = Parse(Hex("4d 2c 01 2e"));  // BININT2 300
  REQUIRE(v.ok());
  CHECK(v->int_value == 300);

  v = Parse(Hex("4e 2e"));
  REQUIRE(v.ok());
  CHECK(v->is_none());

  v = Parse(Hex("88 2e"));
  REQUIRE(v.ok());
  CHECK((v->kind == Kind::kBool && v->bool_value));
}

TEST_CASE("pickle: BINFLOAT is big-endian", "[pickle]") {
  // 0.001 = 0x3F50624DD2F1A9FC
  auto v = Parse(Hex("47 3f 50 62 4d d2 f1 a9 fc 2e"));
  REQUIRE(v.ok());
  CHECK(v->kind == Kind::kFloat);
  CHECK(v->float_value == 0.001);
  v = Parse(PickleWriter().Float(-2.5).Stop().bytes());
  REQUIRE(v.ok());
  CHECK(v->float_value == -2.5);
}

TEST_CASE("pickle: LONG1 and LONG4", "[pickle]") {
  struct Case {
    const char* hex;
    int64_t value;
  };
  const Case cases[] = {
      {"8a 00 2e", 0},
      {"8a 01 ff 2e", -1},
      {"8a 02 00 80 2e", -32768},
      {"8a 03 00 80 00 2e", 32768},
      {"8a 05 00 00 00 80 00 2e", int64_t{1} << 31},
      {"8a 08 00 00 00 00 00 00 00 80 2e", INT64_MIN},
      {"8a 08 ff ff ff ff ff ff ff 7f 2e", INT64_MAX},
      {"8a 09 ff ff ff ff ff ff ff 7f 00 2e", INT64_MAX},  // redundant sign byte
      {"8a 09 00 00 00 00 00 00 00 80 ff 2e", INT64_MIN},
      {"8b 02 00 00 00 00 01 2e", 256},  // LONG4
  };
  for (const Case& c : cases) {
    INFO(c.hex);
    auto v = Parse(Hex(c.hex));
    REQUIRE(v.ok());
    CHECK(v->kind == Kind::kInt);
    CHECK(v->int_value == c.value);
  }
  // 2**63 needs 9 bytes: a big int.
  auto big = Parse(Hex("8a 09 00 00 00 00 00 00 00 80 00 2e"));
  REQUIRE(big.ok());
  CHECK(big->kind == Kind::kBigInt);
  CHECK(big->str.size() == 9);
  // Over-long encodings are normalised.
  auto padded = Parse(Hex("8a 0b 00 00 00 00 00 00 00 80 00 00 00 2e"));
  REQUIRE(padded.ok());
  CHECK(padded->str == big->str);
}

TEST_CASE("pickle: strings, bytes, FRAME", "[pickle]") {
  // PROTO 4, FRAME 11, SHORT_BINUNICODE 'hé', SHORT_BINBYTES b'xy', TUPLE2, STOP
  auto v = Parse(Hex("80 04 95 0b 00 00 00 00 00 00 00 8c 03 68 c3 a9 43 02 78 79 86 2e"));
  REQUIRE(v.ok());
  REQUIRE(v->is_tuple());
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0]->kind == Kind::kStr);
  CHECK(v->items[0]->str == "h\xc3\xa9");
  CHECK(v->items[1]->kind == Kind::kBytes);
  CHECK(v->items[1]->str == "xy");
  // A FRAME longer than the input is corrupt.
  auto bad = Parse(Hex("80 04 95 ff 00 00 00 00 00 00 00 4e 2e"));
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Catch::Contains("FRAME"));
}

TEST_CASE("pickle: large bytes payloads stay in place, located by offset", "[pickle]") {
  // PROTO 4, ( SHORT_BINBYTES 3 "abc", BINBYTES 5 "hello" ) TUPLE2, STOP
  const auto bytes = Hex("80 04 43 03 61 62 63 42 05 00 00 00 68 65 6c 6c 6f 86 2e");
  PickleLimits limits;
  limits.max_inline_bytes = 4;
  auto v = ParsePickle(bytes, limits);
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 2);
  const PickleValue& small = *v->items[0];
  const PickleValue& big = *v->items[1];
  CHECK(small.str == "abc");  // short enough: copied, and located too
  CHECK(small.bytes_offset == 4);
  CHECK(small.bytes_length == 3);
  CHECK(big.kind == Kind::kBytes);
  CHECK(big.str.empty());
  CHECK(big.bytes_offset == 12);
  CHECK(big.bytes_length == 5);
  // By default everything is copied.
  auto all = Parse(bytes);
  REQUIRE(all.ok());
  CHECK(all->items[1]->str == "hello");
}

TEST_CASE("pickle: memo shares values and sees later mutation", "[pickle]") {
  // EMPTY_DICT MEMOIZE ; MARK 'k' 1 SETITEMS is applied after the memo was taken.
  // Result: (d, d) with d = {'k': 1}
  PickleWriter w;
  w.Proto(4).EmptyDict().Memoize().Mark().ShortStr("k").Int(1).SetItems();
  w.BinGet(0).Tuple2().Stop();
  auto v = Parse(w.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0].get() == v->items[1].get());
  REQUIRE(v->items[1]->entries.size() == 1);
  CHECK(v->items[1]->Find("k")->int_value == 1);

  // BINPUT / LONG_BINPUT / BINGET / LONG_BINGET
  auto v2 = Parse(Hex("8c 01 61 71 05 8c 01 62 72 00 01 00 00 6a 00 01 00 00 68 05 87 2e"));
  REQUIRE(v2.ok());
  REQUIRE(v2->items.size() == 3);
  CHECK(v2->items[0]->str == "b");
  CHECK(v2->items[2]->str == "a");

  auto missing = Parse(Hex("68 09 2e"));
  CHECK(missing.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(missing.status().message(), Catch::Contains("memo key 9"));
}

TEST_CASE("pickle: STACK_GLOBAL, NEWOBJ, BUILD, SETITEMS", "[pickle]") {
  PickleWriter w;
  w.Proto(4).StackGlobal("pkg.mod", "Cls").EmptyTuple().NewObj();
  w.EmptyDict().Mark().ShortStr("a").Int(1).ShortStr("b").ShortStr("x").SetItems().Build();
  w.Stop();
  auto v = Parse(w.bytes());
  REQUIRE(v.ok());
  CHECK(v->kind == Kind::kObject);
  REQUIRE(v->CalleeGlobal() != nullptr);
  CHECK(v->CalleeGlobal()->IsGlobal("pkg.mod", "Cls"));
  REQUIRE(v->state);
  CHECK(v->state->Find("a")->int_value == 1);
  CHECK(v->state->Find("b")->str == "x");
  CHECK(v->DebugString() == "pkg.mod.Cls() {'a': 1, 'b': 'x'}");

  // STACK_GLOBAL needs strings.
  auto bad = Parse(Hex("4b 01 4b 02 93 2e"));
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Catch::Contains("STACK_GLOBAL"));
}

TEST_CASE("pickle: both enum pickling forms", "[pickle]") {
  // By value (CPython 3.8-3.10, 3.11.7+): REDUCE(EnumCls, (0,))
  PickleWriter by_value;
  by_value.Proto(4).StackGlobal("m", "MEM_FORMAT_ENCODING").Int(0).Tuple1().Reduce().Stop();
  auto v = Parse(by_value.bytes());
  REQUIRE(v.ok());
  CHECK(v->kind == Kind::kCall);
  CHECK(v->CalleeGlobal()->name == "MEM_FORMAT_ENCODING");
  CHECK(v->args->items[0]->int_value == 0);
  // By name (CPython 3.11.2): REDUCE(getattr, (EnumCls, 'NAME'))
  PickleWriter by_name;
  by_name.Proto(4).StackGlobal("builtins", "getattr").StackGlobal("m", "MEM_FORMAT_ENCODING");
  by_name.ShortStr("TORCH_CONTIGUOUS_FORMAT").Tuple2().Reduce().Stop();
  v = Parse(by_name.bytes());
  REQUIRE(v.ok());
  CHECK(v->CalleeGlobal()->IsGlobal("builtins", "getattr"));
  CHECK(v->args->items[0]->IsGlobal("m", "MEM_FORMAT_ENCODING"));
  CHECK(v->args->items[1]->str == "TORCH_CONTIGUOUS_FORMAT");
}

TEST_CASE("pickle: OrderedDict via REDUCE then SETITEMS, APPENDS on a list", "[pickle]") {
  PickleWriter w;
  w.Proto(2).Global("collections", "OrderedDict").EmptyTuple().Reduce();
  w.Mark().Str("k").EmptyList().Mark().Int(1).Int(2).Appends().SetItems().Stop();
  auto v = Parse(w.bytes());
  REQUIRE(v.ok());
  CHECK(v->kind == Kind::kCall);
  REQUIRE(v->Find("k") != nullptr);
  REQUIRE(v->Find("k")->items.size() == 2);
  CHECK(v->Find("k")->items[1]->int_value == 2);
}

TEST_CASE("pickle: torch.save tensor data.pkl (formats.md 3.6)", "[pickle]") {
  auto v = Parse(Hex(
      "80 02 63 74 6f 72 63 68 2e 5f 75 74 69 6c 73 0a 5f 72 65 62 75 69 6c 64 5f 74 65 6e"
      "73 6f 72 5f 76 32 0a 71 00 28 28 58 07 00 00 00 73 74 6f 72 61 67 65 71 01 63 74 6f"
      "72 63 68 0a 46 6c 6f 61 74 53 74 6f 72 61 67 65 0a 71 02 58 01 00 00 00 30 71 03 58"
      "03 00 00 00 63 70 75 71 04 4b 06 74 71 05 51 4b 00 4b 02 4b 03 86 71 06 4b 03 4b 01"
      "86 71 07 89 63 63 6f 6c 6c 65 63 74 69 6f 6e 73 0a 4f 72 64 65 72 65 64 44 69 63 74"
      "0a 71 08 29 52 71 09 74 71 0a 52 71 0b 2e"));
  REQUIRE(v.ok());
  CHECK(v->CalleeGlobal()->IsGlobal("torch._utils", "_rebuild_tensor_v2"));
  const auto& args = v->args->items;
  REQUIRE(args.size() == 6);
  CHECK(args[0]->kind == Kind::kPersId);
  CHECK(args[0]->callee->items[1]->IsGlobal("torch", "FloatStorage"));
  CHECK(args[0]->callee->items[4]->int_value == 6);
}

// The same object pickled by CPython 3.11 with protocols 0..5:
// {'a': [1, 2.5, None, True, False, b'xy', 'hé€', 2**70, -2**63, (1,), (), -1, 300, 70000,
//        -70000, 2**31, 'q\'"\\\n'],
//  'od': OrderedDict([('k', 1)]), 's': {3}, 'fs': frozenset([4])}
const char* const kProto0 =
    "286470300a56610a70310a286c70320a49310a6146322e350a614e614930310a614930300a61635f636f646563"
    "730a656e636f64650a70330a285678790a70340a566c6174696e310a70350a7470360a5270370a615668e95c75"
    "323061630a70380a614c313138303539313632303731373431313330333432344c0a614c2d3932323333373230"
    "33363835343737353830384c0a612849310a7470390a61287461492d310a61493330300a614937303030300a61"
    "492d37303030300a614c323134373438333634384c0a61567127225c75303035635c75303030610a7031300a61"
    "73566f640a7031310a63636f6c6c656374696f6e730a4f726465726564446963740a7031320a2874527031330a"
    "566b0a7031340a49310a737356730a7031350a635f5f6275696c74696e5f5f0a7365740a7031360a28286c7031"
    "370a49330a61747031380a527031390a735666730a7032300a635f5f6275696c74696e5f5f0a66726f7a656e73"
    "65740a7032310a28286c7032320a49340a61747032330a527032340a732e";
const char* const kProto1 =
    "7d71002858010000006171015d7102284b014740040000000000004e4930310a4930300a635f636f646563730a"
    "656e636f64650a71032858020000007879710458060000006c6174696e317105747106527107580600000068c3"
    "a9e282ac71084c313138303539313632303731373431313330333432344c0a4c2d393232333337323033363835"
    "343737353830384c0a284b01747109294affffffff4d2c014a701101004a90eefeff4c32313437343833363438"
    "4c0a58050000007127225c0a710a6558020000006f64710b63636f6c6c656374696f6e730a4f72646572656444"
    "6963740a710c2952710d58010000006b710e4b0173580100000073710f635f5f6275696c74696e5f5f0a736574"
    "0a7110285d71114b0361747112527113580200000066737114635f5f6275696c74696e5f5f0a66726f7a656e73"
    "65740a7115285d71164b0461747117527118752e";
const char* const kProto2 =
    "80027d71002858010000006171015d7102284b014740040000000000004e8889635f636f646563730a656e636f"
    "64650a710358020000007879710458060000006c6174696e317105867106527107580600000068c3a9e282ac71"
    "088a090000000000000000408a0800000000000000804b01857109294affffffff4d2c014a701101004a90eefe"
    "ff8a05000000800058050000007127225c0a710a6558020000006f64710b63636f6c6c656374696f6e730a4f72"
    "6465726564446963740a710c2952710d58010000006b710e4b0173580100000073710f635f5f6275696c74696e"
    "5f5f0a7365740a71105d71114b0361857112527113580200000066737114635f5f6275696c74696e5f5f0a6672"
    "6f7a656e7365740a71155d71164b0461857117527118752e";
const char* const kProto3 =
    "80037d71002858010000006171015d7102284b014740040000000000004e8889430278797103580600000068c3"
    "a9e282ac71048a090000000000000000408a0800000000000000804b01857105294affffffff4d2c014a701101"
    "004a90eefeff8a05000000800058050000007127225c0a71066558020000006f64710763636f6c6c656374696f"
    "6e730a4f726465726564446963740a71082952710958010000006b710a4b0173580100000073710b636275696c"
    "74696e730a7365740a710c5d710d4b036185710e52710f580200000066737110636275696c74696e730a66726f"
    "7a656e7365740a71115d71124b0461857113527114752e";
const char* const kProto4 =
    "800495a5000000000000007d94288c0161945d94284b014740040000000000004e888943027879948c0668c3a9"
    "e282ac948a090000000000000000408a0800000000000000804b018594294affffffff4d2c014a701101004a90"
    "eefeff8a0500000080008c057127225c0a94658c026f64948c0b636f6c6c656374696f6e73948c0b4f72646572"
    "6564446963749493942952948c016b944b01738c0173948f94284b03908c02667394284b049194752e";
const char* const kProto5 =
    "800595a5000000000000007d94288c0161945d94284b014740040000000000004e888943027879948c0668c3a9"
    "e282ac948a090000000000000000408a0800000000000000804b018594294affffffff4d2c014a701101004a90"
    "eefeff8a0500000080008c057127225c0a94658c026f64948c0b636f6c6c656374696f6e73948c0b4f72646572"
    "6564446963749493942952948c016b944b01738c0173948f94284b03908c02667394284b049194752e";

TEST_CASE("pickle: CPython protocols 0-5 decode to the same values", "[pickle]") {
  const char* const all[] = {kProto0, kProto1, kProto2, kProto3, kProto4, kProto5};
  for (int p = 0; p < 6; ++p) {
    INFO("protocol " << p);
    auto v = Parse(Hex(all[p]));
    REQUIRE(v.ok());
    REQUIRE(v->is_dict());
    const PickleValue* a = v->Find("a");
    REQUIRE(a != nullptr);
    REQUIRE(a->is_list());
    REQUIRE(a->items.size() == 17);
    const auto& it = a->items;
    CHECK(it[0]->int_value == 1);
    CHECK(it[1]->float_value == 2.5);
    CHECK(it[2]->is_none());
    CHECK((it[3]->kind == Kind::kBool && it[3]->bool_value));
    CHECK((it[4]->kind == Kind::kBool && !it[4]->bool_value));
    if (p < 3) {
      // bytes before protocol 3: _codecs.encode('xy', 'latin1')
      CHECK(it[5]->CalleeGlobal() != nullptr);
      CHECK(it[5]->CalleeGlobal()->name == "encode");
    } else {
      CHECK(it[5]->kind == Kind::kBytes);
      CHECK(it[5]->str == "xy");
    }
    CHECK(it[6]->str == "h\xc3\xa9\xe2\x82\xac");
    CHECK(it[7]->kind == Kind::kBigInt);
    CHECK(it[7]->str == std::string("\0\0\0\0\0\0\0\0\x40", 9));
    CHECK(it[8]->int_value == INT64_MIN);
    CHECK((it[9]->is_tuple() && it[9]->items.size() == 1 && it[9]->items[0]->int_value == 1));
    CHECK((it[10]->is_tuple() && it[10]->items.empty()));
    CHECK(it[11]->int_value == -1);
    CHECK(it[12]->int_value == 300);
    CHECK(it[13]->int_value == 70000);
    CHECK(it[14]->int_value == -70000);
    CHECK(it[15]->int_value == int64_t{1} << 31);
    CHECK(it[16]->str == "q'\"\\\n");
    const PickleValue* od = v->Find("od");
    REQUIRE(od != nullptr);
    CHECK(od->CalleeGlobal()->IsGlobal("collections", "OrderedDict"));
    REQUIRE(od->Find("k") != nullptr);
    CHECK(od->Find("k")->int_value == 1);
    const PickleValue* s = v->Find("s");
    const PickleValue* fs = v->Find("fs");
    REQUIRE((s != nullptr && fs != nullptr));
    if (p >= 4) {
      CHECK((s->kind == Kind::kSet && !s->bool_value && s->items[0]->int_value == 3));
      CHECK((fs->kind == Kind::kSet && fs->bool_value && fs->items[0]->int_value == 4));
    } else {
      CHECK(s->CalleeGlobal()->name == "set");
      CHECK(fs->CalleeGlobal()->name == "frozenset");
    }
  }
}

TEST_CASE("pickle: stack discipline", "[pickle]") {
  // POP, DUP, POP_MARK
  auto v = Parse(Hex("4b 01 4b 02 30 32 86 2e"));  // 1 2 POP DUP TUPLE2 -> (1, 1)
  REQUIRE(v.ok());
  CHECK(v->items.size() == 2);
  v = Parse(Hex("4b 09 28 4b 01 4b 02 31 2e"));  // 9 MARK 1 2 POP_MARK STOP -> 9
  REQUIRE(v.ok());
  CHECK(v->int_value == 9);
  // Items below a MARK are out of reach.
  auto under = Parse(Hex("4b 01 28 86 2e"));
  CHECK(under.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(under.status().message(), Catch::Contains("underflow"));
  auto nomark = Parse(Hex("74 2e"));
  CHECK(nomark.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(nomark.status().message(), Catch::Contains("MARK"));
}

TEST_CASE("pickle: malformed and unsupported input", "[pickle]") {
  struct Case {
    const char* hex;
    StatusCode code;
    const char* substr;
  };
  const Case cases[] = {
      {"", StatusCode::kDataLoss, "without STOP"},
      {"80 02 4b", StatusCode::kDataLoss, "BININT1 at byte 2"},
      {"ff 2e", StatusCode::kDataLoss, "unknown opcode"},
      {"58 ff ff ff 7f 2e", StatusCode::kDataLoss, "exceeds"},
      {"8d ff ff ff ff ff ff ff ff", StatusCode::kDataLoss, "exceeds"},
      {"8b ff ff ff ff 2e", StatusCode::kDataLoss, "negative LONG4"},
      {"80 06 4e 2e", StatusCode::kUnimplemented, "protocol 6"},
      {"82 01 2e", StatusCode::kUnimplemented, "EXT1"},
      {"97 2e", StatusCode::kUnimplemented, "NEXT_BUFFER"},
      {"2e", StatusCode::kDataLoss, "underflow"},
      {"4b 00 4b 01 4b 02 73 2e", StatusCode::kDataLoss, "cannot set items on a int"},
      {"4b 01 4b 02 62 2e", StatusCode::kDataLoss, "cannot BUILD a int"},
      {"4b 01 4b 02 52 2e", StatusCode::kDataLoss, "not a tuple"},
      {"49 31 32 78 0a 2e", StatusCode::kDataLoss, "bad integer literal"},
      {"63 74 6f 72 63 68", StatusCode::kDataLoss, "no terminating newline"},
  };
  for (const Case& c : cases) {
    INFO(c.hex);
    auto v = Parse(Hex(c.hex));
    REQUIRE(!v.ok());
    CHECK(v.status().code() == c.code);
    CHECK_THAT(v.status().message(), Catch::Contains(c.substr));
  }
}

TEST_CASE("pickle: cycles and depth are refused", "[pickle]") {
  // l = []; l.append(l)
  auto cyc = Parse(Hex("5d 94 68 00 61 2e"));
  CHECK(cyc.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(cyc.status().message(), Catch::Contains("cycle"));
  // A cycle abandoned mid-stream (no STOP) must not leak or crash.
  auto partial = Parse(Hex("5d 94 68 00 61"));
  CHECK(partial.status().code() == StatusCode::kDataLoss);

  std::vector<std::byte> deep;
  for (int i = 0; i < 2000; ++i) deep.push_back(std::byte{']'});
  for (int i = 0; i < 1999; ++i) deep.push_back(std::byte{'a'});
  deep.push_back(std::byte{'.'});
  auto d = Parse(deep);
  CHECK(d.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(d.status().message(), Catch::Contains("deeper"));
  PickleLimits generous;
  generous.max_depth = 5000;
  CHECK(ParsePickle(deep, generous).ok());
}

TEST_CASE("pickle: deep values left in the memo are released safely", "[pickle]") {
  // 200k nested lists, memoized and popped; the result is None. Destroying the nest
  // recursively would overflow the stack. (The tree, ~53 MB from 400 KB, is past the
  // default budget: this is about releasing it.)
  std::vector<std::byte> b;
  const int n = 200000;
  for (int i = 0; i < n; ++i) b.push_back(std::byte{']'});
  for (int i = 0; i < n - 1; ++i) b.push_back(std::byte{'a'});
  for (int c : {0x94, int{'0'}, int{'N'}, int{'.'}}) b.push_back(static_cast<std::byte>(c));
  PickleLimits roomy;
  roomy.max_tree_bytes_base = uint64_t{256} << 20;
  auto v = ParsePickle(b, roomy);
  REQUIRE(v.ok());
  CHECK(v->is_none());
  b.pop_back();  // and the same without STOP (the failure path)
  CHECK(ParsePickle(b, roomy).status().code() == StatusCode::kDataLoss);
  // Within the default budget it is refused before it is built.
  CHECK(Parse(b).status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("pickle: a long chain of BUILDs stays linear", "[pickle]") {
  // 100k BUILD({'k<i>': i}) on one object: merging by copying would be quadratic.
  PickleWriter w;
  w.Proto(4).StackGlobal("m", "C").EmptyTuple().NewObj();
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    w.EmptyDict().ShortStr("k" + std::to_string(i)).Int(i).SetItem().Build();
  }
  w.Stop();
  // 100k transient dicts take more tree memory per input byte than the default budget
  // allows (metadata files never do this); the point here is the time.
  PickleLimits generous;
  generous.max_tree_bytes_per_input_byte = 64;
  auto v = ParsePickle(w.bytes(), generous);
  REQUIRE(v.ok());
  REQUIRE(v->state);
  CHECK(v->state->entries.size() == static_cast<size_t>(n));
  CHECK(v->state->Find("k99999")->int_value == 99999);
}

TEST_CASE("pickle: DebugString is bounded", "[pickle]") {
  PickleWriter w;
  w.Proto(4).EmptyList().Mark();
  for (int i = 0; i < 1000; ++i) w.Str("a long string value");
  w.Appends().Stop();
  auto v = Parse(w.bytes());
  REQUIRE(v.ok());
  CHECK(v->DebugString(50).size() <= 53);
}

}  // namespace
}  // namespace fc

namespace fc {
namespace {

TEST_CASE("pickle: equal calls are shared until filled, memoized or duplicated",
          "[pickle][memory]") {
  // Two torch.Size((8, 6)) built separately: immutable, one node.
  PickleWriter sizes;
  sizes.Proto(2).Mark();
  for (int i = 0; i < 2; ++i) {
    sizes.Global("torch", "Size").Int(8).Int(6).Tuple2().Tuple1().Reduce();
  }
  sizes.Op('t').Stop();
  auto v = Parse(sizes.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0].get() == v->items[1].get());
  CHECK(v->DebugString() == "(torch.Size((8, 6)), torch.Size((8, 6)))");

  // OrderedDict() twice, the second filled by SETITEMS: the first stays empty.
  PickleWriter filled;
  filled.Proto(2).Mark();
  filled.Global("collections", "OrderedDict").EmptyTuple().Reduce();
  filled.Global("collections", "OrderedDict").EmptyTuple().Reduce();
  filled.Mark().ShortStr("k").Int(1).SetItems();
  filled.Global("collections", "OrderedDict").EmptyTuple().Reduce();
  filled.ShortStr("j").Int(2).SetItem();
  filled.Op('t').Stop();
  v = Parse(filled.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 3);
  CHECK(v->items[0]->entries.empty());
  CHECK(v->items[1]->Find("k")->int_value == 1);
  CHECK(v->items[1]->Find("j") == nullptr);
  CHECK(v->items[2]->Find("j")->int_value == 2);
  CHECK(v->items[2]->Find("k") == nullptr);
  CHECK(v->DebugString() == "(collections.OrderedDict(), collections.OrderedDict(), "
                            "collections.OrderedDict())");

  // Memoized, then filled: a later GET sees the filled value; an equal call made
  // before the memo does not.
  PickleWriter memo;
  memo.Proto(2).Global("collections", "OrderedDict").EmptyTuple().Reduce();
  memo.Global("collections", "OrderedDict").EmptyTuple().Reduce().BinPut(0);
  memo.ShortStr("k").Int(3).SetItem().Op('0' /* POP */).BinGet(0).Tuple2().Stop();
  v = Parse(memo.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0]->entries.empty());
  REQUIRE(v->items[1]->Find("k") != nullptr);
  CHECK(v->items[1]->Find("k")->int_value == 3);

  // DUP then BUILD on the top: both stack entries are the one object, as in Python.
  PickleWriter dup;
  dup.Proto(2).Global("m", "C").EmptyTuple().Reduce().Op('2' /* DUP */);
  dup.EmptyDict().ShortStr("a").Int(4).SetItem().Build().Tuple2().Stop();
  v = Parse(dup.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0].get() == v->items[1].get());
  REQUIRE(v->items[0]->state);
  CHECK(v->items[0]->state->Find("a")->int_value == 4);

  // BUILD on a shared call leaves the other equal call without state.
  PickleWriter build;
  build.Proto(2).Global("m", "C").EmptyTuple().Reduce();
  build.Global("m", "C").EmptyTuple().Reduce().EmptyDict().Build().Tuple2().Stop();
  v = Parse(build.bytes());
  REQUIRE(v.ok());
  CHECK(v->items[0]->state == nullptr);
  CHECK(v->items[1]->state != nullptr);
}

TEST_CASE("pickle: a memoized string referenced 200k times is shared, not copied",
          "[pickle][memory]") {
  // ~512 KB of string and ~1 MB of BINGETs: copying per reference would need 100 GB.
  const std::string big(512 * 1024, 'p');
  testing::PickleWriter w;
  w.Proto(2).Str(big).BinPut(0).Op(0x30 /* POP */).EmptyList().Mark();
  for (int i = 0; i < 200000; ++i) w.BinGet(0);
  w.Appends().Stop();
  auto v = ParsePickle(w.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 200000);
  CHECK(v->items.front()->str.size() == big.size());
  CHECK(v->items.front().get() == v->items.back().get());  // one node, 200k links
}

TEST_CASE("pickle: the tree's memory budget counts bytes", "[pickle][memory]") {
  // 1M empty lists in 1 MB: ~280 MB of nodes, past 64 x 1 MB + 64 MiB.
  testing::PickleWriter w;
  w.Proto(2).Mark();
  for (int i = 0; i < 1000000; ++i) w.EmptyList();
  w.Op('l').Stop();
  auto v = ParsePickle(w.bytes());
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(v.status().message(), Catch::Contains("MiB allowed"));
  // The same pickle within a larger budget parses.
  PickleLimits roomy;
  roomy.max_tree_bytes_base = uint64_t{1} << 30;
  auto ok = ParsePickle(w.bytes(), roomy);
  REQUIRE(ok.ok());
  CHECK(ok->items.size() == 1000000);
}

TEST_CASE("pickle: MEMOIZE numbers keys by the memo's size; sparse keys work",
          "[pickle][memo]") {
  testing::PickleWriter w;
  w.Proto(4).EmptyList().Mark();
  w.ShortStr("a").BinPut(200);  // memo size 1
  w.ShortStr("b").Memoize();    // key 1
  w.ShortStr("c");
  w.Op(0x72 /* LONG_BINPUT */);
  const uint8_t key[4] = {0x00, 0x00, 0x00, 0xf0};  // 4026531840: far beyond the others
  w.Raw(std::as_bytes(std::span<const uint8_t>(key)));
  w.BinGet(1).BinGet(200).Op(0x6a /* LONG_BINGET */).Raw(std::as_bytes(std::span<const uint8_t>(key)));
  w.Appends().Stop();
  auto v = ParsePickle(w.bytes());
  REQUIRE(v.ok());
  REQUIRE(v->items.size() == 6);
  CHECK(v->items[3]->str == "b");
  CHECK(v->items[4]->str == "a");
  CHECK(v->items[5]->str == "c");
  testing::PickleWriter bad;
  bad.Proto(2).BinGet(3).Stop();
  CHECK(ParsePickle(bad.bytes()).status().code() == StatusCode::kDataLoss);
}

// A small pickle whose value shares one sub-value many times over: 80 nested pairs [x, x]
// through the memo, 2^80 values when written once per reference: re-pickling it
// (EmitPickleValue) stops at its output bound instead of running for ever. (The walks over
// such a value are tested where they live: tests/format/deepspeed, tests/format/megatron.)
TEST_CASE("pickle: a shared value nested 80 times is re-pickled within a bound",
          "[pickle][hostile]") {
  std::vector<std::byte> b;
  auto put = [&](std::initializer_list<int> bytes) {
    for (int x : bytes) b.push_back(static_cast<std::byte>(x));
  };
  put({0x80, 2, ']', 'q', 0});  // PROTO 2, EMPTY_LIST, BINPUT 0
  for (int i = 1; i <= 80; ++i) put({'(', 'h', i - 1, 'h', i - 1, 'l', 'q', i});
  put({'.'});
  Result<PickleValue> v = Parse(b);
  REQUIRE(v.ok());
  internal_torch::PickleWriter w(2);
  Status emitted = EmitPickleValue(w, *v, "nested");
  CHECK(emitted.code() == StatusCode::kResourceExhausted);
  CHECK(emitted.message().find("nested: re-pickled value passes 256 MiB") != std::string::npos);
}

}  // namespace
}  // namespace fc
