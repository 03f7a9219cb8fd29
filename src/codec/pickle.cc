// The pickle stack machine. Layout and contract: include/fc/codec/pickle.h.
//
// Design notes:
// - Python's Unpickler keeps a "metastack": MARK saves the current stack and starts a new
//   one. We keep one vector plus mark positions and refuse to pop below the innermost
//   mark, which is equivalent and catches the same malformed inputs.
// - Nodes are shared_ptrs because the memo shares them (and because a dict may be
//   memoized before SETITEMS fills it, later BINGETs must see the filled dict). A crafted
//   pickle can build a cycle; shared_ptr cycles leak, so the machine remembers every
//   container it created and clears their children when parsing fails.
#include "fc/codec/pickle.h"

#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>

#include "fc/codec/pickle_walk.h"
#include "src/codec/pickle_opcodes.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;
// A node with its make_shared control block and malloc's header fits a 224-byte chunk
// (libstdc++); a 1M-chunk torch .metadata holds about 6M of them.
static_assert(sizeof(PickleValue) <= 200, "PickleValue grew: big .metadata files pay per node");
using MutPtr = std::shared_ptr<PickleValue>;

using enum internal_torch::PickleOp;

std::string OpName(uint8_t op) {
  switch (op) {
    case kMark: return "MARK";
    case kStop: return "STOP";
    case kPop: return "POP";
    case kPopMark: return "POP_MARK";
    case kDup: return "DUP";
    case kFloat: return "FLOAT";
    case kInt: return "INT";
    case kBinInt: return "BININT";
    case kBinInt1: return "BININT1";
    case kLong: return "LONG";
    case kBinInt2: return "BININT2";
    case kNone: return "NONE";
    case kPersId: return "PERSID";
    case kBinPersId: return "BINPERSID";
    case kReduce: return "REDUCE";
    case kString: return "STRING";
    case kBinString: return "BINSTRING";
    case kShortBinString: return "SHORT_BINSTRING";
    case kUnicode: return "UNICODE";
    case kBinUnicode: return "BINUNICODE";
    case kAppend: return "APPEND";
    case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL";
    case kDict: return "DICT";
    case kEmptyDict: return "EMPTY_DICT";
    case kAppends: return "APPENDS";
    case kGet: return "GET";
    case kBinGet: return "BINGET";
    case kInst: return "INST";
    case kLongBinGet: return "LONG_BINGET";
    case kList: return "LIST";
    case kEmptyList: return "EMPTY_LIST";
    case kObj: return "OBJ";
    case kPut: return "PUT";
    case kBinPut: return "BINPUT";
    case kLongBinPut: return "LONG_BINPUT";
    case kSetItem: return "SETITEM";
    case kTuple: return "TUPLE";
    case kEmptyTuple: return "EMPTY_TUPLE";
    case kSetItems: return "SETITEMS";
    case kBinFloat: return "BINFLOAT";
    case kProto: return "PROTO";
    case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1";
    case kExt2: return "EXT2";
    case kExt4: return "EXT4";
    case kTuple1: return "TUPLE1";
    case kTuple2: return "TUPLE2";
    case kTuple3: return "TUPLE3";
    case kNewTrue: return "NEWTRUE";
    case kNewFalse: return "NEWFALSE";
    case kLong1: return "LONG1";
    case kLong4: return "LONG4";
    case kBinBytes: return "BINBYTES";
    case kShortBinBytes: return "SHORT_BINBYTES";
    case kShortBinUnicode: return "SHORT_BINUNICODE";
    case kBinUnicode8: return "BINUNICODE8";
    case kBinBytes8: return "BINBYTES8";
    case kEmptySet: return "EMPTY_SET";
    case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET";
    case kNewObjEx: return "NEWOBJ_EX";
    case kStackGlobal: return "STACK_GLOBAL";
    case kMemoize: return "MEMOIZE";
    case kFrame: return "FRAME";
    case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER";
    case kReadonlyBuffer: return "READONLY_BUFFER";
    default: {
      static const char kHex[] = "0123456789abcdef";
      std::string s = "opcode 0x";
      s += kHex[op >> 4];
      s += kHex[op & 15];
      return s;
    }
  }
}

bool IsContainer(Kind k) {
  return k == Kind::kTuple || k == Kind::kList || k == Kind::kDict || k == Kind::kSet ||
         k == Kind::kCall || k == Kind::kObject || k == Kind::kPersId;
}

// Decodes an n-byte two's-complement little-endian integer (LONG1/LONG4 payload).
void DecodeLong(std::span<const std::byte> bytes, PickleValue* out) {
  const size_t n = bytes.size();
  if (n == 0) {
    out->kind = Kind::kInt;
    out->int_value = 0;
    return;
  }
  const bool negative = (static_cast<uint8_t>(bytes[n - 1]) & 0x80) != 0;
  // Fits int64 when every byte beyond the 8th is pure sign extension of bit 63.
  bool fits = true;
  if (n > 8) {
    const uint8_t ext = negative ? 0xff : 0x00;
    for (size_t i = 8; i < n; ++i) {
      if (static_cast<uint8_t>(bytes[i]) != ext) fits = false;
    }
    if ((static_cast<uint8_t>(bytes[7]) & 0x80) != (negative ? 0x80 : 0)) fits = false;
  }
  if (!fits) {
    out->kind = Kind::kBigInt;
    out->str.assign(reinterpret_cast<const char*>(bytes.data()), n);
    // Minimal form, so equal values compare equal whatever encoding the writer chose.
    while (out->str.size() > 9) {
      const auto top = static_cast<uint8_t>(out->str.back());
      const auto next = static_cast<uint8_t>(out->str[out->str.size() - 2]);
      if ((top == 0x00 && next < 0x80) || (top == 0xff && next >= 0x80)) {
        out->str.pop_back();
      } else {
        break;
      }
    }
    return;
  }
  uint64_t u = negative ? ~uint64_t{0} : 0;
  for (size_t i = 0; i < n && i < 8; ++i) {
    u &= ~(uint64_t{0xff} << (8 * i));
    u |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  }
  out->kind = Kind::kInt;
  out->int_value = static_cast<int64_t>(u);
}

// Parses a decimal integer literal of any length into *out (kInt or kBigInt).
// Returns false when `text` is not [+-]digits.
bool DecodeDecimal(std::string_view text, PickleValue* out) {
  bool negative = false;
  if (!text.empty() && (text.front() == '-' || text.front() == '+')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  std::vector<uint8_t> mag;  // little-endian magnitude
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    unsigned carry = static_cast<unsigned>(c - '0');
    for (uint8_t& b : mag) {
      const unsigned v = b * 10u + carry;
      b = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;
    }
    while (carry != 0) {
      mag.push_back(static_cast<uint8_t>(carry & 0xff));
      carry >>= 8;
    }
  }
  mag.push_back(0);  // room for the sign bit
  if (negative) {
    unsigned carry = 1;
    for (uint8_t& b : mag) {
      const unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;
    }
  }
  DecodeLong(std::as_bytes(std::span<const uint8_t>(mag)), out);
  return true;
}

// Appends the UTF-8 encoding of a code point.
void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

uint64_t TreeBudget(uint64_t input_bytes, const PickleLimits& limits) {
  const uint64_t scaled = input_bytes > UINT64_MAX / (limits.max_tree_bytes_per_input_byte + 1)
                              ? UINT64_MAX
                              : input_bytes * limits.max_tree_bytes_per_input_byte;
  return scaled > UINT64_MAX - limits.max_tree_bytes_base ? UINT64_MAX
                                                          : scaled + limits.max_tree_bytes_base;
}

class Machine {
 public:
  Machine(std::span<const std::byte> data, const PickleLimits& limits)
      : data_(data), limits_(limits), tree_budget_(TreeBudget(data.size(), limits)) {}

  ~Machine() {
    // Break every link that is not part of the returned (checked, depth-bounded) value:
    // a failed parse may hold cycles (which would leak), and values left behind in the
    // memo or on the stack may nest arbitrarily deep (whose recursive destruction would
    // overflow the stack). Every container is still owned by containers_, so clearing
    // never destroys anything recursively.
    for (const MutPtr& n : containers_) {
      if (!succeeded_ || n->graph_mark != 2) {
        n->items.clear();
        n->entries.clear();
        n->callee.reset();
        n->args.reset();
        n->kwargs.reset();
        n->state.reset();
      }
    }
  }

  Result<PickleValue> Run();
  size_t consumed() const { return pos_; }  // bytes read up to and including STOP

 private:
  Status Error(std::string what) const {
    return DataLossError("pickle: " + OpName(op_) + " at byte " + std::to_string(op_pos_) +
                         ": " + what);
  }
  Status Unsupported(std::string what) const {
    return UnimplementedError("pickle: " + OpName(op_) + " at byte " +
                              std::to_string(op_pos_) + ": " + what);
  }
  Status Truncated() const { return Error("input ends inside the operand"); }

  size_t remaining() const { return data_.size() - pos_; }

  Result<std::span<const std::byte>> Take(uint64_t n) {
    if (n > remaining()) {
      return Error("operand length " + std::to_string(n) + " exceeds the " +
                   std::to_string(remaining()) + " bytes left");
    }
    auto s = data_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  template <typename T>
  Result<T> ReadLe() {
    if (remaining() < sizeof(T)) return Truncated();
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      v |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  // A text operand up to (not including) '\n'.
  Result<std::string_view> ReadLine() {
    for (size_t i = pos_; i < data_.size(); ++i) {
      if (data_[i] == std::byte{'\n'}) {
        std::string_view line(reinterpret_cast<const char*>(data_.data()) + pos_, i - pos_);
        pos_ = i + 1;
        return line;
      }
    }
    return Error("text operand has no terminating newline");
  }

  // Immutable values that occur thousands of times (None, booleans, small ints, the empty
  // tuple of every NEWOBJ) share one node each, which keeps big .metadata files cheap.
  MutPtr Shared(Kind kind, int64_t value) {
    MutPtr& slot = kind == Kind::kInt    ? small_ints_[static_cast<size_t>(value + 1)]
                   : kind == Kind::kBool ? bools_[value != 0]
                   : kind == Kind::kNone ? none_
                                         : empty_tuple_;
    if (!slot) {
      slot = std::make_shared<PickleValue>();
      slot->kind = kind;
      slot->int_value = kind == Kind::kInt ? value : 0;
      slot->bool_value = kind == Kind::kBool && value != 0;
      slot->content_shared = true;
    }
    return slot;
  }
  void PushInt(int64_t value) {
    if (value >= -1 && value < 256) {
      Push(Shared(Kind::kInt, value));
      return;
    }
    // Ints are immutable, and a big .metadata repeats the same offsets and lengths for
    // every tensor of a layout: one node per distinct value (the map entry costs a fifth
    // of a node).
    MutPtr& slot = ints_[value];
    if (!slot) {
      Charge(48);  // the map entry
      slot = New(Kind::kInt);
      slot->int_value = value;
      slot->content_shared = true;
    }
    Push(slot);
  }

  // Approximate heap bytes of the tree being built (nodes, links, string bytes); Run fails
  // with kResourceExhausted once it passes the budget (checked after every opcode).
  void Charge(uint64_t bytes) { tree_bytes_ += bytes; }

  MutPtr New(Kind kind) {
    Charge(sizeof(PickleValue) + 32);  // the node, its control block, malloc's header
    auto n = std::make_shared<PickleValue>();
    n->kind = kind;
    if (IsContainer(kind)) containers_.push_back(n);
    return n;
  }
  // Every value pushed may become one link of a container (16-32 bytes) or a memo slot.
  void Push(MutPtr n) {
    Charge(32);
    stack_.push_back(std::move(n));
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  Result<MutPtr> Pop() {
    if (stack_.size() <= floor()) return Error("stack underflow");
    MutPtr n = std::move(stack_.back());
    stack_.pop_back();
    return n;
  }
  Result<MutPtr> Top() {
    if (stack_.size() <= floor()) return Error("stack underflow");
    return stack_.back();
  }
  // Pops everything above the innermost mark, and the mark.
  Result<std::vector<MutPtr>> PopMark() {
    if (marks_.empty()) return Error("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<MutPtr> items(std::make_move_iterator(stack_.begin() + m),
                              std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  static std::vector<PickleValue::Ptr> Freeze(std::vector<MutPtr> v) {
    return std::vector<PickleValue::Ptr>(std::make_move_iterator(v.begin()),
                                         std::make_move_iterator(v.end()));
  }

  // Tuples are immutable too: a small tuple of interned values (a torch.Size's dims, the
  // args tuple around it) is interned by its items' identities, so the many chunks of a
  // layout that share offsets or sizes share their tuples.
  // The key is the items' identities, inline: a lookup that finds the tuple allocates
  // nothing (a big .metadata makes hundreds of thousands of such tuples).
  static constexpr size_t kInternedTupleMax = 8;
  struct TupleKey {
    std::array<const PickleValue*, kInternedTupleMax> items{};
    size_t size = 0;
    bool operator==(const TupleKey&) const = default;
  };
  struct TupleKeyHash {
    size_t operator()(const TupleKey& k) const {
      size_t h = k.size;
      for (size_t i = 0; i < k.size; ++i) {
        h = h * 1000003u ^ std::hash<const PickleValue*>()(k.items[i]);
      }
      return h;
    }
  };
  // Pops the top `n` values into a tuple.
  Result<MutPtr> PopTuple(size_t n) {
    if (stack_.size() < floor() + n) return Error("stack underflow");
    const auto first = stack_.end() - static_cast<ptrdiff_t>(n);
    MutPtr t = MakeTuple(std::span<MutPtr>(first, stack_.end()));
    stack_.erase(first, stack_.end());
    return t;
  }
  MutPtr MakeTuple(std::span<MutPtr> items) {
    bool internable = items.size() <= kInternedTupleMax;
    for (const MutPtr& i : items) internable = internable && i->content_shared;
    if (!internable) {
      MutPtr t = New(Kind::kTuple);
      t->items.assign(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end()));
      return t;
    }
    TupleKey key;
    key.size = items.size();
    for (size_t i = 0; i < items.size(); ++i) key.items[i] = items[i].get();
    auto it = tuples_.find(key);
    if (it != tuples_.end()) return it->second;
    Charge(sizeof(TupleKey) + 48);  // the map entry
    MutPtr t = New(Kind::kTuple);
    t->items.assign(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end()));
    t->content_shared = true;
    tuples_.emplace(key, t);
    return t;
  }

  Status PushString(Kind kind, uint64_t n) {
    const uint64_t offset = pos_;
    FC_ASSIGN_OR_RETURN(auto bytes, Take(n));
    if (kind == Kind::kStr && n <= kInternedStrMax) {
      // Strs are immutable: one node per distinct short str. Writers that do not memoize
      // repeat every attribute name ("offsets", "sizes", ...) once per object.
      std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      auto it = strs_.find(text);
      if (it == strs_.end()) {
        MutPtr v = New(kind);
        Charge(bytes.size() + 64);  // the string and the map entry
        v->str.assign(text);
        v->content_shared = true;
        it = strs_.emplace(std::string_view(v->str), std::move(v)).first;
      }
      Push(it->second);
      return Status::Ok();
    }
    MutPtr v = New(kind);
    if (kind == Kind::kBytes) {
      v->bytes_offset = offset;
      v->bytes_length = n;
      // Large payloads (tensor data) stay where they are: the caller reads them by offset.
      if (n > limits_.max_inline_bytes) {
        Push(std::move(v));
        return Status::Ok();
      }
    }
    Charge(bytes.size());
    v->str.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    Push(std::move(v));
    return Status::Ok();
  }
  // Globals are immutable (no opcode fills one): one node per distinct module and name.
  Status PushGlobal(std::string module, std::string name) {
    std::string key = module + '\n' + name;
    MutPtr& slot = globals_[key];
    if (!slot) {
      Charge(64 + key.size() + module.size() + name.size());  // the map entry, the strings
      slot = New(Kind::kGlobal);
      slot->str = std::move(module);
      slot->name = std::move(name);
      slot->content_shared = true;
    }
    Push(slot);
    return Status::Ok();
  }
  // REDUCE of a shared callable on a shared args tuple (torch.Size((8, 6)), repeated for
  // every chunk of a big .metadata) is shared by content too, until something could
  // observe or change its identity: an opcode that fills the top of the stack (BUILD,
  // SETITEM(S), APPEND(S)), memoizes it (later GETs must see the filled object) or
  // duplicates it. Those first replace a shared call on top of the stack by a private copy
  // (UnshareTop); a shared call that is no longer on the stack can be reached only
  // through values that are themselves immutable.
  MutPtr MakeCall(MutPtr callee, MutPtr args) {
    if (!callee->content_shared || !args->content_shared) {
      MutPtr c = New(Kind::kCall);
      c->callee = std::move(callee);
      c->args = std::move(args);
      return c;
    }
    MutPtr& slot = calls_[{callee.get(), args.get()}];
    if (!slot) {
      Charge(48);  // the map entry
      slot = New(Kind::kCall);
      slot->callee = std::move(callee);
      slot->args = std::move(args);
      slot->content_shared = true;
    }
    return slot;
  }
  Status UnshareTop() {
    if (stack_.size() <= floor()) return Error("stack underflow");
    MutPtr& top = stack_.back();
    if (top->kind == Kind::kCall && top->content_shared) {
      MutPtr c = New(Kind::kCall);
      c->callee = top->callee;
      c->args = top->args;
      top = std::move(c);
    }
    return Status::Ok();
  }
  Result<MutPtr> TopMutable() {
    FC_RETURN_IF_ERROR(UnshareTop());
    return stack_.back();
  }
  // The memo: keys are dense in practice (BINPUT 0, 1, 2, ... or MEMOIZE), so they index a
  // vector (16 bytes an entry, a hash map costs ~4x that); a key far beyond the vector's
  // size (a crafted LONG_BINPUT 4000000000) goes to a small map instead.
  Status Memoize(uint64_t key) {
    FC_ASSIGN_OR_RETURN(MutPtr top, TopMutable());
    MutPtr* slot = nullptr;
    if (key < memo_dense_.size()) {
      slot = &memo_dense_[static_cast<size_t>(key)];
    } else if (key < 2 * memo_dense_.size() + 4096) {
      // Charged before growing: each key may double the vector, and twenty 5-byte opcodes
      // would otherwise ask for 2^32 entries before Run's check after the opcode.
      Charge((key + 1 - memo_dense_.size()) * sizeof(MutPtr));
      if (tree_bytes_ > tree_budget_) {
        return ResourceExhaustedError("pickle: memo key " + std::to_string(key) + " at byte " +
                                      std::to_string(op_pos_) + " would pass the " +
                                      std::to_string(tree_budget_ >> 20) + " MiB allowed");
      }
      memo_dense_.resize(static_cast<size_t>(key) + 1);
      slot = &memo_dense_[static_cast<size_t>(key)];
    } else {
      slot = &memo_sparse_[key];
    }
    if (!*slot) ++memo_count_;
    *slot = std::move(top);
    return Status::Ok();
  }
  Status MemoGet(uint64_t key) {
    const MutPtr* slot = nullptr;
    if (key < memo_dense_.size()) {
      slot = &memo_dense_[static_cast<size_t>(key)];
    } else if (auto it = memo_sparse_.find(key); it != memo_sparse_.end()) {
      slot = &it->second;
    }
    if (slot == nullptr || !*slot) {
      return Error("memo key " + std::to_string(key) + " not defined");
    }
    Push(*slot);
    return Status::Ok();
  }
  Status ParseDecimalKey(std::string_view line, uint64_t* key) {
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), *key);
    if (ec != std::errc() || p != line.data() + line.size()) {
      return Error("bad memo key '" + std::string(line.substr(0, 32)) + "'");
    }
    return Status::Ok();
  }
  Status AddEntries(const MutPtr& target, std::vector<MutPtr> kv) {
    if (kv.size() % 2 != 0) return Error("odd number of items for key/value pairs");
    if (target->kind != Kind::kDict && target->kind != Kind::kCall &&
        target->kind != Kind::kObject) {
      return Error(std::string("cannot set items on a ") +
                   std::string(PickleKindName(target->kind)));
    }
    // Exact capacity for the usual one SETITEMS into an empty dict (growth by doubling
    // would leave a 3-entry __dict__ room for 4); later batches grow normally.
    if (target->entries.empty()) target->entries.reserve(kv.size() / 2);
    for (size_t i = 0; i < kv.size(); i += 2) {
      target->entries.emplace_back(std::move(kv[i]), std::move(kv[i + 1]));
    }
    return Status::Ok();
  }
  Status AddItems(const MutPtr& target, std::vector<MutPtr> items) {
    if (target->kind != Kind::kList && target->kind != Kind::kCall &&
        target->kind != Kind::kObject) {
      return Error(std::string("cannot append to a ") +
                   std::string(PickleKindName(target->kind)));
    }
    for (auto& i : items) target->items.push_back(std::move(i));
    return Status::Ok();
  }
  Status Step(uint8_t op);
  Status StepControl(uint8_t op);
  Status StepScalar(uint8_t op);
  Status PushBinaryLong(uint8_t op);
  Status PushTextInt(uint8_t op);
  Status StepString(uint8_t op);
  Status StepContainer(uint8_t op);
  Status FillContainer(uint8_t op);
  Status StepObject(uint8_t op);
  Status NewObject(uint8_t op);
  Status InstantiateMarked(uint8_t op);
  Status Build();
  Status StepMemo(uint8_t op);
  Status DecodeQuotedString(std::string_view line, std::string* out);
  Status DecodeRawUnicodeEscape(std::string_view line, std::string* out);
  Status CheckGraph(const PickleValue* v, size_t depth);

  std::span<const std::byte> data_;
  PickleLimits limits_;
  size_t pos_ = 0;
  uint8_t op_ = 0;
  size_t op_pos_ = 0;
  bool stopped_ = false;
  bool succeeded_ = false;
  uint64_t tree_budget_;
  uint64_t tree_bytes_ = 0;
  std::vector<MutPtr> stack_;
  std::vector<size_t> marks_;
  std::vector<MutPtr> memo_dense_;
  std::unordered_map<uint64_t, MutPtr> memo_sparse_;
  size_t memo_count_ = 0;  // defined keys (MEMOIZE uses the next one)
  // A deque: at millions of containers a vector's doubling would briefly hold the old and
  // the new array (3x the links) at the peak of the parse.
  std::deque<MutPtr> containers_;
  // Objects whose BUILD state is a merged dict that only they own (see BUILD).
  std::unordered_map<const PickleValue*, MutPtr> owned_states_;
  MutPtr small_ints_[257];
  std::unordered_map<int64_t, MutPtr> ints_;  // other ints seen (see PushInt)
  static constexpr uint64_t kInternedStrMax = 256;
  // Values shared by content carry PickleValue::content_shared (never mutated after
  // creation: the singletons, interned ints, strs, globals, tuples and calls). Only these
  // may go into an interned tuple or call.
  struct PairHash {
    size_t operator()(const std::pair<const PickleValue*, const PickleValue*>& k) const {
      return std::hash<const PickleValue*>()(k.first) * 1000003u ^
             std::hash<const PickleValue*>()(k.second);
    }
  };
  std::unordered_map<std::pair<const PickleValue*, const PickleValue*>, MutPtr, PairHash> calls_;
  std::unordered_map<std::string, MutPtr> globals_;  // key: module '\n' name
  std::unordered_map<TupleKey, MutPtr, TupleKeyHash> tuples_;
  std::unordered_map<std::string_view, MutPtr> strs_;  // short strs seen; keys view node->str
  MutPtr bools_[2];
  MutPtr none_;
  MutPtr empty_tuple_;
};

Status Machine::DecodeQuotedString(std::string_view line, std::string* out) {
  // Protocol 0 STRING: a Python repr, 'abc' or "abc", with backslash escapes.
  if (line.size() < 2 || (line.front() != '\'' && line.front() != '"') ||
      line.back() != line.front()) {
    return Error("STRING operand is not quoted");
  }
  line = line.substr(1, line.size() - 2);
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i >= line.size()) return Error("dangling backslash in STRING");
    switch (line[i]) {
      case '\\': out->push_back('\\'); break;
      case '\'': out->push_back('\''); break;
      case '"': out->push_back('"'); break;
      case 'n': out->push_back('\n'); break;
      case 'r': out->push_back('\r'); break;
      case 't': out->push_back('\t'); break;
      case 'x': {
        if (i + 2 >= line.size()) return Error("short \\x escape in STRING");
        int hi = HexDigit(line[i + 1]), lo = HexDigit(line[i + 2]);
        if (hi < 0 || lo < 0) return Error("bad \\x escape in STRING");
        out->push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        return Unsupported(std::string("escape \\") + line[i] + " in STRING");
    }
  }
  return Status::Ok();
}

Status Machine::DecodeRawUnicodeEscape(std::string_view line, std::string* out) {
  // Protocol 0 UNICODE: latin-1 bytes, plus \uXXXX and \UXXXXXXXX escapes.
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\\' && i + 1 < line.size() && (line[i + 1] == 'u' || line[i + 1] == 'U')) {
      const size_t digits = line[i + 1] == 'u' ? 4 : 8;
      if (i + 2 + digits > line.size()) return Error("short \\u escape in UNICODE");
      uint32_t cp = 0;
      for (size_t k = 0; k < digits; ++k) {
        int d = HexDigit(line[i + 2 + k]);
        if (d < 0) return Error("bad \\u escape in UNICODE");
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      if (cp > 0x10ffff) return Error("code point beyond U+10FFFF in UNICODE");
      AppendUtf8(cp, out);
      i += 1 + digits;
    } else {
      AppendUtf8(static_cast<uint8_t>(c), out);
    }
  }
  return Status::Ok();
}

// Step reads the opcode's operand at pos_ and applies it; the opcodes are handled in groups
// (stack control, numbers, strings, containers, objects, the memo), one function each.
Status Machine::Step(uint8_t op) {
  switch (op) {
    case kProto:
    case kFrame:
    case kStop:
    case kMark:
    case kPop:
    case kPopMark:
    case kDup:
      return StepControl(op);
    case kNone:
    case kNewTrue:
    case kNewFalse:
    case kBinInt1:
    case kBinInt2:
    case kBinInt:
    case kLong1:
    case kLong4:
    case kInt:
    case kLong:
    case kBinFloat:
    case kFloat:
      return StepScalar(op);
    case kShortBinUnicode:
    case kShortBinBytes:
    case kShortBinString:
    case kBinUnicode:
    case kBinBytes:
    case kBinString:
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8:
    case kString:
    case kUnicode:
      return StepString(op);
    case kEmptyTuple:
    case kEmptyList:
    case kEmptyDict:
    case kEmptySet:
    case kTuple1:
    case kTuple2:
    case kTuple3:
    case kTuple:
    case kList:
    case kFrozenSet:
    case kDict:
      return StepContainer(op);
    case kAppend:
    case kAppends:
    case kAddItems:
    case kSetItem:
    case kSetItems:
      return FillContainer(op);
    case kGlobal:
    case kStackGlobal:
    case kReduce:
    case kNewObj:
    case kNewObjEx:
    case kInst:
    case kObj:
    case kBuild:
    case kPersId:
    case kBinPersId:
      return StepObject(op);
    case kBinPut:
    case kLongBinPut:
    case kPut:
    case kMemoize:
    case kBinGet:
    case kLongBinGet:
    case kGet:
      return StepMemo(op);
    case kExt1:
    case kExt2:
    case kExt4:
      return Unsupported("the copyreg extension registry is not supported");
    case kNextBuffer:
    case kReadonlyBuffer:
      return Unsupported("out-of-band buffers are not supported");
    default:
      return Error("unknown opcode");
  }
}

// PROTO, FRAME, STOP and the opcodes that only move stack entries.
Status Machine::StepControl(uint8_t op) {
  switch (op) {
    case kProto: {
      FC_ASSIGN_OR_RETURN(uint8_t proto, ReadLe<uint8_t>());
      if (proto > 5) return Unsupported("protocol " + std::to_string(proto));
      return Status::Ok();
    }
    case kFrame: {
      FC_ASSIGN_OR_RETURN(uint64_t len, ReadLe<uint64_t>());
      if (len > remaining()) {
        return Error("frame of " + std::to_string(len) + " bytes exceeds the " +
                     std::to_string(remaining()) + " bytes left");
      }
      return Status::Ok();
    }
    case kStop: {
      stopped_ = true;
      return Status::Ok();
    }
    case kMark:
      marks_.push_back(stack_.size());
      return Status::Ok();
    case kPop:
      if (stack_.size() > floor()) {
        stack_.pop_back();
        return Status::Ok();
      }
      return PopMark().status();
    case kPopMark:
      return PopMark().status();
    case kDup: {
      FC_ASSIGN_OR_RETURN(MutPtr top, TopMutable());
      Push(std::move(top));
      return Status::Ok();
    }
    default:
      return Error("unknown opcode");
  }
}

// None, booleans, ints and floats.
Status Machine::StepScalar(uint8_t op) {
  switch (op) {
    case kNone:
      Push(Shared(Kind::kNone, 0));
      return Status::Ok();
    case kNewTrue:
    case kNewFalse:
      Push(Shared(Kind::kBool, op == kNewTrue));
      return Status::Ok();
    case kBinInt1: {
      FC_ASSIGN_OR_RETURN(uint8_t x, ReadLe<uint8_t>());
      PushInt(x);
      return Status::Ok();
    }
    case kBinInt2: {
      FC_ASSIGN_OR_RETURN(uint16_t x, ReadLe<uint16_t>());
      PushInt(x);
      return Status::Ok();
    }
    case kBinInt: {
      FC_ASSIGN_OR_RETURN(uint32_t x, ReadLe<uint32_t>());
      PushInt(static_cast<int32_t>(x));
      return Status::Ok();
    }
    case kLong1:
    case kLong4:
      return PushBinaryLong(op);
    case kInt:
    case kLong:
      return PushTextInt(op);
    case kBinFloat: {
      if (remaining() < 8) return Truncated();
      uint64_t bits = 0;
      for (size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
      pos_ += 8;
      MutPtr v = New(Kind::kFloat);
      v->float_value = std::bit_cast<double>(bits);
      Push(std::move(v));
      return Status::Ok();
    }
    case kFloat: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      MutPtr v = New(Kind::kFloat);
      auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v->float_value);
      if (ec != std::errc() || p != line.data() + line.size()) {
        return Error("bad float literal '" + std::string(line.substr(0, 32)) + "'");
      }
      Push(std::move(v));
      return Status::Ok();
    }
    default:
      return Error("unknown opcode");
  }
}

// LONG1 / LONG4: a length, then that many bytes of two's-complement little-endian int.
Status Machine::PushBinaryLong(uint8_t op) {
  uint64_t n = 0;
  if (op == kLong1) {
    FC_ASSIGN_OR_RETURN(uint8_t x, ReadLe<uint8_t>());
    n = x;
  } else {
    FC_ASSIGN_OR_RETURN(uint32_t x, ReadLe<uint32_t>());
    if (static_cast<int32_t>(x) < 0) return Error("negative LONG4 length");
    n = x;
  }
  FC_ASSIGN_OR_RETURN(auto bytes, Take(n));
  MutPtr v = New(Kind::kInt);
  DecodeLong(bytes, v.get());
  Push(std::move(v));
  return Status::Ok();
}

// INT / LONG: a decimal text line (protocol 0; INT "00"/"01" are False/True).
Status Machine::PushTextInt(uint8_t op) {
  FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
  MutPtr v = New(Kind::kInt);
  if (op == kInt && (line == "00" || line == "01")) {
    v->kind = Kind::kBool;
    v->bool_value = line == "01";
  } else {
    if (op == kLong && !line.empty() && line.back() == 'L') line.remove_suffix(1);
    // Decimal conversion is quadratic; CPython refuses more digits than this too.
    if (line.size() > 4300) return Unsupported("integer literal of more than 4300 digits");
    if (!DecodeDecimal(line, v.get())) {
      return Error("bad integer literal '" + std::string(line.substr(0, 32)) + "'");
    }
  }
  Push(std::move(v));
  return Status::Ok();
}

// strs and bytes: binary (length-prefixed) and protocol 0 text forms.
Status Machine::StepString(uint8_t op) {
  switch (op) {
    case kShortBinUnicode:
    case kShortBinBytes:
    case kShortBinString: {
      FC_ASSIGN_OR_RETURN(uint8_t n, ReadLe<uint8_t>());
      return PushString(op == kShortBinBytes ? Kind::kBytes : Kind::kStr, n);
    }
    case kBinUnicode:
    case kBinBytes:
    case kBinString: {
      FC_ASSIGN_OR_RETURN(uint32_t n, ReadLe<uint32_t>());
      if (op == kBinString && static_cast<int32_t>(n) < 0) return Error("negative length");
      return PushString(op == kBinBytes ? Kind::kBytes : Kind::kStr, n);
    }
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8: {
      FC_ASSIGN_OR_RETURN(uint64_t n, ReadLe<uint64_t>());
      return PushString(op == kBinUnicode8 ? Kind::kStr : Kind::kBytes, n);
    }
    case kString: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      MutPtr v = New(Kind::kStr);
      FC_RETURN_IF_ERROR(DecodeQuotedString(line, &v->str));
      Push(std::move(v));
      return Status::Ok();
    }
    case kUnicode: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      MutPtr v = New(Kind::kStr);
      FC_RETURN_IF_ERROR(DecodeRawUnicodeEscape(line, &v->str));
      Push(std::move(v));
      return Status::Ok();
    }
    default:
      return Error("unknown opcode");
  }
}

// Tuples, lists, dicts and sets: building them and filling them.
Status Machine::StepContainer(uint8_t op) {
  switch (op) {
    case kEmptyTuple:
      Push(Shared(Kind::kTuple, 0));
      return Status::Ok();
    case kEmptyList:
      Push(New(Kind::kList));
      return Status::Ok();
    case kEmptyDict:
      Push(New(Kind::kDict));
      return Status::Ok();
    case kEmptySet:
      Push(New(Kind::kSet));
      return Status::Ok();
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      FC_ASSIGN_OR_RETURN(MutPtr t, PopTuple(static_cast<size_t>(op - kTuple1) + 1));
      Push(std::move(t));
      return Status::Ok();
    }
    case kTuple:
    case kList:
    case kFrozenSet: {
      FC_ASSIGN_OR_RETURN(auto items, PopMark());
      if (op == kTuple) {
        Push(MakeTuple(std::span<MutPtr>(items)));
        return Status::Ok();
      }
      MutPtr t = New(op == kList ? Kind::kList : Kind::kSet);
      t->bool_value = op == kFrozenSet;
      t->items = Freeze(std::move(items));
      Push(std::move(t));
      return Status::Ok();
    }
    case kDict: {
      FC_ASSIGN_OR_RETURN(auto items, PopMark());
      MutPtr d = New(Kind::kDict);
      FC_RETURN_IF_ERROR(AddEntries(d, std::move(items)));
      Push(std::move(d));
      return Status::Ok();
    }
    default:
      return Error("unknown opcode");
  }
}

// APPEND(S), ADDITEMS, SETITEM(S): values added to the container below them.
Status Machine::FillContainer(uint8_t op) {
  switch (op) {
    case kAppend: {
      FC_ASSIGN_OR_RETURN(MutPtr v, Pop());
      FC_ASSIGN_OR_RETURN(MutPtr target, TopMutable());
      std::vector<MutPtr> one;
      one.push_back(std::move(v));
      return AddItems(target, std::move(one));
    }
    case kAppends: {
      FC_ASSIGN_OR_RETURN(auto items, PopMark());
      FC_ASSIGN_OR_RETURN(MutPtr target, TopMutable());
      return AddItems(target, std::move(items));
    }
    case kAddItems: {
      FC_ASSIGN_OR_RETURN(auto items, PopMark());
      FC_ASSIGN_OR_RETURN(MutPtr target, Top());
      if (target->kind != Kind::kSet || target->bool_value) {
        return Error("ADDITEMS target is not a set");
      }
      for (auto& i : items) target->items.push_back(std::move(i));
      return Status::Ok();
    }
    case kSetItem: {
      FC_ASSIGN_OR_RETURN(MutPtr value, Pop());
      FC_ASSIGN_OR_RETURN(MutPtr key, Pop());
      FC_ASSIGN_OR_RETURN(MutPtr target, TopMutable());
      std::vector<MutPtr> kv;
      kv.push_back(std::move(key));
      kv.push_back(std::move(value));
      return AddEntries(target, std::move(kv));
    }
    case kSetItems: {
      FC_ASSIGN_OR_RETURN(auto items, PopMark());
      FC_ASSIGN_OR_RETURN(MutPtr target, TopMutable());
      return AddEntries(target, std::move(items));
    }
    default:
      return Error("unknown opcode");
  }
}

// Globals, calls and objects (nothing is called: see the header), persistent ids.
Status Machine::StepObject(uint8_t op) {
  switch (op) {
    case kGlobal: {
      FC_ASSIGN_OR_RETURN(std::string_view module, ReadLine());
      FC_ASSIGN_OR_RETURN(std::string_view name, ReadLine());
      return PushGlobal(std::string(module), std::string(name));
    }
    case kStackGlobal: {
      FC_ASSIGN_OR_RETURN(MutPtr name, Pop());
      FC_ASSIGN_OR_RETURN(MutPtr module, Pop());
      if (name->kind != Kind::kStr || module->kind != Kind::kStr) {
        return Error("module and name must be strings");
      }
      return PushGlobal(module->str, name->str);
    }
    case kReduce: {
      FC_ASSIGN_OR_RETURN(MutPtr args, Pop());
      FC_ASSIGN_OR_RETURN(MutPtr callee, Pop());
      if (args->kind != Kind::kTuple) return Error("REDUCE arguments are not a tuple");
      Push(MakeCall(std::move(callee), std::move(args)));
      return Status::Ok();
    }
    case kNewObj:
    case kNewObjEx:
      return NewObject(op);
    case kInst:
    case kObj:
      return InstantiateMarked(op);
    case kBuild:
      return Build();
    case kPersId: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      MutPtr pid = New(Kind::kStr);
      pid->str = std::string(line);
      MutPtr p = New(Kind::kPersId);
      p->callee = std::move(pid);
      Push(std::move(p));
      return Status::Ok();
    }
    case kBinPersId: {
      FC_ASSIGN_OR_RETURN(MutPtr pid, Pop());
      MutPtr p = New(Kind::kPersId);
      p->callee = std::move(pid);
      Push(std::move(p));
      return Status::Ok();
    }
    default:
      return Error("unknown opcode");
  }
}

// NEWOBJ (class, args) and NEWOBJ_EX (class, args, kwargs).
Status Machine::NewObject(uint8_t op) {
  MutPtr kwargs;
  if (op == kNewObjEx) {
    FC_ASSIGN_OR_RETURN(kwargs, Pop());
    if (kwargs->kind != Kind::kDict) return Error("NEWOBJ_EX kwargs are not a dict");
  }
  FC_ASSIGN_OR_RETURN(MutPtr args, Pop());
  FC_ASSIGN_OR_RETURN(MutPtr cls, Pop());
  if (args->kind != Kind::kTuple) return Error("NEWOBJ arguments are not a tuple");
  MutPtr o = New(Kind::kObject);
  o->callee = std::move(cls);
  o->args = std::move(args);
  o->kwargs = std::move(kwargs);
  Push(std::move(o));
  return Status::Ok();
}

// INST (class named by two text lines) and OBJ (class first after the mark): an object of
// the values above the mark.
Status Machine::InstantiateMarked(uint8_t op) {
  if (op == kInst) {
    FC_ASSIGN_OR_RETURN(std::string_view module, ReadLine());
    FC_ASSIGN_OR_RETURN(std::string_view name, ReadLine());
    FC_ASSIGN_OR_RETURN(auto items, PopMark());
    MutPtr cls = New(Kind::kGlobal);
    cls->str = std::string(module);
    cls->name = std::string(name);
    MutPtr args = New(Kind::kTuple);
    args->items = Freeze(std::move(items));
    MutPtr o = New(Kind::kObject);
    o->callee = std::move(cls);
    o->args = std::move(args);
    Push(std::move(o));
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(auto items, PopMark());
  if (items.empty()) return Error("OBJ without a class");
  MutPtr o = New(Kind::kObject);
  o->callee = std::move(items.front());
  items.erase(items.begin());
  MutPtr args = New(Kind::kTuple);
  args->items = Freeze(std::move(items));
  o->args = std::move(args);
  Push(std::move(o));
  return Status::Ok();
}

// BUILD: the popped value becomes the state of the object below it.
Status Machine::Build() {
  FC_ASSIGN_OR_RETURN(MutPtr state, Pop());
  FC_ASSIGN_OR_RETURN(MutPtr target, TopMutable());
  if (target->kind != Kind::kObject && target->kind != Kind::kCall) {
    return Error(std::string("cannot BUILD a ") + std::string(PickleKindName(target->kind)));
  }
  if (target->state && target->state->kind == Kind::kDict && state->kind == Kind::kDict) {
    // A second BUILD with a dict updates __dict__ further. Merge into a dict private to
    // this object (the first state may be shared through the memo), once, then append:
    // copying on every BUILD would make a chain of BUILDs quadratic.
    auto owned = owned_states_.find(target.get());
    if (owned == owned_states_.end()) {
      MutPtr merged = New(Kind::kDict);
      Charge(32 * target->state->entries.size());
      merged->entries = target->state->entries;
      target->state = merged;
      owned = owned_states_.emplace(target.get(), std::move(merged)).first;
    }
    Charge(32 * state->entries.size());
    owned->second->entries.insert(owned->second->entries.end(), state->entries.begin(),
                                  state->entries.end());
  } else {
    target->state = std::move(state);
    owned_states_.erase(target.get());
  }
  return Status::Ok();
}

// PUT / GET and their binary forms, MEMOIZE.
Status Machine::StepMemo(uint8_t op) {
  switch (op) {
    case kBinPut: {
      FC_ASSIGN_OR_RETURN(uint8_t key, ReadLe<uint8_t>());
      return Memoize(key);
    }
    case kLongBinPut: {
      FC_ASSIGN_OR_RETURN(uint32_t key, ReadLe<uint32_t>());
      return Memoize(key);
    }
    case kPut: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      uint64_t key = 0;
      FC_RETURN_IF_ERROR(ParseDecimalKey(line, &key));
      return Memoize(key);
    }
    case kMemoize:
      return Memoize(memo_count_);
    case kBinGet: {
      FC_ASSIGN_OR_RETURN(uint8_t key, ReadLe<uint8_t>());
      return MemoGet(key);
    }
    case kLongBinGet: {
      FC_ASSIGN_OR_RETURN(uint32_t key, ReadLe<uint32_t>());
      return MemoGet(key);
    }
    case kGet: {
      FC_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      uint64_t key = 0;
      FC_RETURN_IF_ERROR(ParseDecimalKey(line, &key));
      return MemoGet(key);
    }
    default:
      return Error("unknown opcode");
  }
}

Status Machine::CheckGraph(const PickleValue* v, size_t depth) {
  if (v == nullptr || !IsContainer(v->kind)) return Status::Ok();
  if (depth > limits_.max_depth) {
    return UnimplementedError("pickle: values nested deeper than " +
                              std::to_string(limits_.max_depth) + " levels");
  }
  // graph_mark: 0 = not seen, 1 = on the current path, 2 = finished.
  if (v->graph_mark == 2) return Status::Ok();
  if (v->graph_mark == 1) return UnimplementedError("pickle: the value contains a reference cycle");
  v->graph_mark = 1;
  Status st = Status::Ok();
  ForEachChild(*v, [&](const PickleValue* c) {
    if (st.ok()) st = CheckGraph(c, depth + 1);
  });
  FC_RETURN_IF_ERROR(st);
  v->graph_mark = 2;
  return Status::Ok();
}

Result<PickleValue> Machine::Run() {
  while (!stopped_) {
    if (pos_ >= data_.size()) {
      return DataLossError("pickle: input ends after " + std::to_string(data_.size()) +
                           " bytes without STOP");
    }
    op_pos_ = pos_;
    op_ = static_cast<uint8_t>(data_[pos_++]);
    FC_RETURN_IF_ERROR(Step(op_));
    if (tree_bytes_ > tree_budget_) {
      return ResourceExhaustedError(
          "pickle: " + OpName(op_) + " at byte " + std::to_string(op_pos_) +
          ": the values built so far take about " + std::to_string(tree_bytes_ >> 20) +
          " MiB, more than the " + std::to_string(tree_budget_ >> 20) +
          " MiB allowed for a " + std::to_string(data_.size()) + "-byte pickle");
    }
  }
  FC_ASSIGN_OR_RETURN(MutPtr result, Pop());
  FC_RETURN_IF_ERROR(CheckGraph(result.get(), 0));
  succeeded_ = true;
  return PickleValue(*result);
}

void Render(const PickleValue& v, size_t max_chars, std::string* out);

void RenderSeq(const std::vector<PickleValue::Ptr>& items, size_t max_chars, std::string* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (out->size() >= max_chars) return;
    if (i > 0) *out += ", ";
    Render(*items[i], max_chars, out);
  }
}

void Render(const PickleValue& v, size_t max_chars, std::string* out) {
  if (out->size() >= max_chars) return;
  switch (v.kind) {
    case Kind::kNone: *out += "None"; return;
    case Kind::kBool: *out += v.bool_value ? "True" : "False"; return;
    case Kind::kInt: *out += std::to_string(v.int_value); return;
    case Kind::kBigInt: *out += "<int of " + std::to_string(v.str.size()) + " bytes>"; return;
    case Kind::kFloat: {
      char buf[32];
      auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v.float_value);
      out->append(buf, ec == std::errc() ? p : buf);
      return;
    }
    case Kind::kStr:
    case Kind::kBytes: {
      if (v.kind == Kind::kBytes) *out += 'b';
      *out += '\'';
      for (char c : v.str) {
        if (out->size() >= max_chars) break;
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '\'' && c != '\\') {
          *out += c;
        } else if (u >= 0x80 && v.kind == Kind::kStr) {
          *out += c;  // UTF-8 continuation of a printable string
        } else {
          static const char kHex[] = "0123456789abcdef";
          *out += "\\x";
          *out += kHex[u >> 4];
          *out += kHex[u & 15];
        }
      }
      *out += '\'';
      return;
    }
    case Kind::kTuple:
      *out += '(';
      RenderSeq(v.items, max_chars, out);
      if (v.items.size() == 1) *out += ',';
      *out += ')';
      return;
    case Kind::kList:
      *out += '[';
      RenderSeq(v.items, max_chars, out);
      *out += ']';
      return;
    case Kind::kSet:
      *out += v.bool_value ? "frozenset({" : "{";
      RenderSeq(v.items, max_chars, out);
      *out += v.bool_value ? "})" : "}";
      return;
    case Kind::kDict:
      *out += '{';
      for (size_t i = 0; i < v.entries.size(); ++i) {
        if (out->size() >= max_chars) break;
        if (i > 0) *out += ", ";
        Render(*v.entries[i].first, max_chars, out);
        *out += ": ";
        Render(*v.entries[i].second, max_chars, out);
      }
      *out += '}';
      return;
    case Kind::kGlobal:
      *out += v.str + "." + v.name;
      return;
    case Kind::kCall:
    case Kind::kObject:
      if (v.callee) Render(*v.callee, max_chars, out);
      *out += '(';
      if (v.args) RenderSeq(v.args->items, max_chars, out);
      *out += ')';
      if (v.state) {
        *out += ' ';
        Render(*v.state, max_chars, out);
      }
      return;
    case Kind::kPersId:
      *out += "persistent_id(";
      if (v.callee) Render(*v.callee, max_chars, out);
      *out += ')';
      return;
  }
}

}  // namespace

std::string_view PickleKindName(PickleValue::Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBigInt: return "big int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kGlobal: return "global";
    case Kind::kCall: return "call";
    case Kind::kObject: return "object";
    case Kind::kPersId: return "persistent id";
  }
  return "?";
}

const PickleValue* PickleValue::CalleeGlobal() const {
  if ((kind == Kind::kCall || kind == Kind::kObject) && callee &&
      callee->kind == Kind::kGlobal) {
    return callee.get();
  }
  return nullptr;
}

const PickleValue* PickleValue::Find(std::string_view key) const {
  const PickleValue* found = nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kStr && k->str == key) found = v.get();
  }
  return found;
}

std::string PickleValue::DebugString(size_t max_chars) const {
  std::string out;
  Render(*this, max_chars, &out);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

Result<PickleValue> ParsePickle(std::span<const std::byte> data, const PickleLimits& limits) {
  Machine m(data, limits);
  return m.Run();
}

Result<PickleValue> ParsePickle(std::span<const std::byte> data, const PickleLimits& limits,
                                size_t* consumed) {
  Machine m(data, limits);
  FC_ASSIGN_OR_RETURN(PickleValue v, m.Run());
  *consumed = m.consumed();
  return v;
}

}  // namespace fc
