// The compact pickle machine. Contract: src/codec/compact_pickle.h.
//
// Why a second machine: the general one (pickle.cc) gives every value a ~200-byte
// shared_ptr node, so a 1M-chunk torch DCP .metadata cost seconds of allocation and GBs
// of RSS. Here a value is an 8-byte tagged word; only containers, globals and floats get a
// 40-byte node in one array, and links live in one array too. Container contents are
// segments of the link array: a SETITEMS/APPENDS batch is one segment, appended to the
// container's chain (Python batches lists and dicts by 1000 items).
//
// Anything outside the subset fails with a short message: callers fall back to the general
// machine, which is the reference for values and errors. So this machine must never accept
// what the general one refuses; it refuses more (see the header) and checks the same
// structural rules (stack discipline, memo keys, cycles, depth).
#include "src/codec/compact_pickle.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "src/codec/pickle_opcodes.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;
using enum internal_torch::PickleOp;

constexpr uint64_t kTagNode = 0, kTagInt = 1, kTagNone = 2, kTagBool = 3, kTagStr = 4,
                   kTagBytes = 5, kTagAbsent = 7;
constexpr uint64_t kNoneBits = kTagNone;
constexpr uint64_t kAbsent = kTagAbsent;
constexpr int64_t kInlineIntMin = -(int64_t{1} << 60), kInlineIntMax = (int64_t{1} << 60) - 1;
constexpr uint64_t kMaxViewLength = (uint64_t{1} << 29) - 1;

uint64_t Tag(uint64_t bits) { return bits & 7; }
uint64_t NodeRef(size_t index) { return static_cast<uint64_t>(index) << 3 | kTagNode; }

Status NotHere(const char* what) {
  return UnimplementedError(std::string("compact pickle: ") + what);
}

bool IsContainer(Kind k) {
  return k == Kind::kTuple || k == Kind::kList || k == Kind::kDict || k == Kind::kCall ||
         k == Kind::kObject;
}

}  // namespace

constexpr uint8_t kFlagEntries = 1;  // the segments hold key/value pairs
constexpr uint8_t kFlagItems = 2;    // the segments hold items (call/object filled by APPEND)
constexpr uint8_t kFlagShared = 4;   // shared by content (an interned tuple or call): immutable
constexpr size_t kInternedTupleMax = 8;

// A seed for the intern table's hash that differs between processes and runs (where the
// loader places this function, and the clock), so keys cannot be chosen to collide.
static uint64_t HashSeed() {
  static const uint64_t seed = [] {
    uint64_t v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&HashSeed));
    v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    v *= 0xbf58476d1ce4e5b9u;
    return v ^ (v >> 31);
  }();
  return seed;
}

class CompactPickleMachine {
 public:
  CompactPickleMachine(std::span<const std::byte> data, const PickleLimits& limits)
      : data_(data), limits_(limits) {
    // Heights are 16-bit and saturate: a deeper limit could not be checked.
    limits_.max_depth = std::min<size_t>(limits_.max_depth, UINT16_MAX - 2);
    budget_ = (data.size() > (UINT64_MAX >> 5) ? UINT64_MAX : 8 * uint64_t{data.size()}) +
              (uint64_t{32} << 20);
  }

  Result<CompactPickle> Run();

 private:
  using Node = CompactPickle::Node;
  using Segment = CompactPickle::Segment;

  size_t remaining() const { return data_.size() - pos_; }
  bool Read(size_t n, uint64_t* v) {
    if (remaining() < n) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) x |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    pos_ += n;
    *v = x;
    return true;
  }
  uint64_t NewNode(Kind kind) {
    const uint16_t height = IsContainer(kind) ? 1 : 0;
    out_.nodes_.push_back(Node{kind, 0, height, 0, 0, 0, kAbsent, kAbsent, kAbsent});
    return NodeRef(out_.nodes_.size() - 1);
  }
  // Heights (container levels, the node included; 0 for scalars) are kept up to date as
  // values are linked: without a reused mutable container (below) the value is a tree of
  // final subtrees, so the root's height bounds every depth.
  uint16_t HeightOf(uint64_t ref) {
    if (Tag(ref) != kTagNode) return 0;
    return NodeOf(ref).height;
  }
  void RaiseHeight(uint64_t parent, uint64_t child) {
    Node& p = NodeOf(parent);
    const uint16_t h = HeightOf(child);
    const uint16_t above = h >= UINT16_MAX - 1 ? UINT16_MAX : static_cast<uint16_t>(h + 1);
    p.height = std::max(p.height, above);
  }
  // A GET or DUP of a container that can still change (list, dict, object, unshared call)
  // can make the value a graph with cycles: then Run walks it all (CheckGraph).
  void NoteReuse(uint64_t ref) {
    if (Tag(ref) != kTagNode) return;
    const Node& n = NodeOf(ref);
    if ((n.kind == Kind::kList || n.kind == Kind::kDict || n.kind == Kind::kObject ||
         n.kind == Kind::kCall) &&
        (n.flags & kFlagShared) == 0) {
      reused_mutable_ = true;
    }
  }
  Node& NodeOf(uint64_t ref) { return out_.nodes_[static_cast<size_t>(ref >> 3)]; }
  Kind KindOf(uint64_t ref) const { return out_.kind(CompactPickle::Ref{ref}); }
  uint64_t PushInt(int64_t v) {
    if (v >= kInlineIntMin && v <= kInlineIntMax) return static_cast<uint64_t>(v) << 3 | kTagInt;
    uint64_t r = NewNode(Kind::kInt);
    NodeOf(r).a = static_cast<uint64_t>(v);
    return r;
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  bool Pop(uint64_t* v) {
    if (stack_.size() <= floor()) return false;
    *v = stack_.back();
    stack_.pop_back();
    return true;
  }
  // Appends stack_[from, end) to the container's chain and drops them from the stack.
  void AppendLinks(uint64_t container, size_t from) {
    const size_t n = stack_.size() - from;
    Node& c = NodeOf(container);
    const size_t start = out_.links_.size();
    for (size_t i = from; i < stack_.size(); ++i) {
      out_.links_.push_back(stack_[i]);
      RaiseHeight(container, stack_[i]);
    }
    stack_.resize(from);
    if (n == 0) return;
    c.count += static_cast<uint32_t>(n);
    if (c.last != 0) {
      Segment& last = out_.segments_[c.last];
      if (last.start + last.count == start) {  // still at the end of the link array
        last.count += static_cast<uint32_t>(n);
        return;
      }
    }
    out_.segments_.push_back(Segment{static_cast<uint32_t>(start), static_cast<uint32_t>(n), 0});
    const auto s = static_cast<uint32_t>(out_.segments_.size() - 1);
    if (c.last != 0) {
      out_.segments_[c.last].next = s;
    } else {
      c.first = s;
    }
    c.last = s;
  }
  // Immutable values (see the header): scalars, views, globals and interned nodes.
  bool Shareable(uint64_t ref) {
    if (Tag(ref) != kTagNode) return true;
    const Node& n = NodeOf(ref);
    return n.kind == Kind::kGlobal || n.kind == Kind::kInt || (n.flags & kFlagShared) != 0;
  }
  // Keys hold attacker-chosen bits (inline ints): the seed, random per machine, keeps a
  // crafted file from aiming many keys at one slot (and the probe cap below bounds the cost
  // if one does anyway).
  uint64_t Mix(uint64_t h, uint64_t v) const {
    h = (h ^ v ^ hash_seed_) * 0x9e3779b97f4a7c15u;
    return h ^ (h >> 29);
  }
  // The intern table: open addressing, keyed by content. An entry keeps the hash and the
  // first two links (a call's callee and args), so a lookup seldom touches the node arrays.
  struct InternEntry {
    uint64_t hash = 0;
    uint64_t k0 = 0, k1 = 0;
    uint32_t node = 0;   // node index + 1; 0: empty
    uint32_t count = 0;  // tuple: items; call: kCallKey
  };
  static constexpr uint32_t kCallKey = UINT32_MAX;
  // Finds the interned node equal to the key (count links at stack_[from...] for a tuple,
  // or a call of k0 on k1), or returns kAbsent with *slot where to insert it.
  uint64_t FindInterned(uint64_t h, uint32_t count, uint64_t k0, uint64_t k1, size_t from,
                        size_t* slot) {
    // A small direct-mapped cache of recent finds first: the table outgrows the CPU caches
    // on big files, and writers repeat the same sizes and offsets in runs.
    InternEntry& recent = recent_[static_cast<size_t>(h >> 40) & (kRecent - 1)];
    if (count <= 2 || count == kCallKey) {
      if (recent.node != 0 && recent.hash == h && recent.count == count && recent.k0 == k0 &&
          recent.k1 == k1) {
        return NodeRef(recent.node - 1);
      }
    }
    const uint64_t found = FindInTable(h, count, k0, k1, from, slot);
    if (found != kAbsent) recent = intern_[*slot];
    return found;
  }
  // *slot is kNoSlot when the probe ran past kMaxProbes: the value is then not interned
  // (sharing is only a saving; a crafted cluster must not make every insert a long scan).
  static constexpr size_t kNoSlot = SIZE_MAX;
  static constexpr size_t kMaxProbes = 64;
  uint64_t FindInTable(uint64_t h, uint32_t count, uint64_t k0, uint64_t k1, size_t from,
                       size_t* slot) {
    const size_t mask = intern_.size() - 1;
    size_t probes = 0;
    for (size_t i = static_cast<size_t>(h) & mask;; i = (i + 1) & mask) {
      if (++probes > kMaxProbes) {
        *slot = kNoSlot;
        return kAbsent;
      }
      const InternEntry& e = intern_[i];
      if (e.node == 0) {
        *slot = i;
        return kAbsent;
      }
      if (e.hash != h || e.count != count || e.k0 != k0 || e.k1 != k1) continue;
      const uint64_t ref = NodeRef(e.node - 1);
      bool same = true;
      if (count != kCallKey) {
        const Node& n = NodeOf(ref);
        for (size_t k = 2; k < count && same; ++k) {
          same = out_.links_[n.first + k] == stack_[from + k];
        }
      }
      if (same) {
        *slot = i;
        return ref;
      }
    }
  }
  void Intern(uint64_t ref, size_t slot, uint64_t h, uint32_t count, uint64_t k0, uint64_t k1,
              uint16_t height) {
    Node& n = NodeOf(ref);
    n.flags |= kFlagShared;
    n.height = height;
    intern_[slot] = InternEntry{h, k0, k1, static_cast<uint32_t>((ref >> 3) + 1), count};
    recent_[static_cast<size_t>(h >> 40) & (kRecent - 1)] = intern_[slot];
    if (++intern_count_ * 2 > intern_.size()) {  // grow: rehash
      std::vector<InternEntry> old(intern_.size() * 2);
      old.swap(intern_);
      const size_t mask = intern_.size() - 1;
      for (const InternEntry& e : old) {
        if (e.node == 0) continue;
        size_t i = static_cast<size_t>(e.hash) & mask;
        while (intern_[i].node != 0) i = (i + 1) & mask;
        intern_[i] = e;
      }
    }
  }
  // An interned tuple remembers (in its otherwise unused a, b, c) the interned 1-tuple that
  // wraps it and the last interned call made on it: torch.Size((8, 6)) is TUPLE2 TUPLE1
  // REDUCE, and this makes the last two lookups two reads of a node just used.
  bool SharedTuple(uint64_t ref) {
    if (Tag(ref) != kTagNode) return false;
    const Node& n = NodeOf(ref);
    return n.kind == Kind::kTuple && (n.flags & kFlagShared) != 0;
  }
  uint64_t MakeTuple(size_t from) {
    const size_t n = stack_.size() - from;
    if (n == 0) return EmptyTuple();
    const uint64_t inner = stack_[from];
    if (n == 1 && SharedTuple(inner) && NodeOf(inner).a != kAbsent) {
      stack_.resize(from);
      return NodeOf(inner).a;
    }
    const uint64_t t = MakeTupleSlow(from);
    if (n == 1 && SharedTuple(inner) && SharedTuple(t)) NodeOf(inner).a = t;
    return t;
  }
  uint64_t MakeTupleSlow(size_t from) {
    const size_t n = stack_.size() - from;
    bool internable = n <= kInternedTupleMax;
    uint16_t height = 0;
    for (size_t i = from; i < stack_.size(); ++i) {
      internable = internable && Shareable(stack_[i]);
      height = std::max(height, HeightOf(stack_[i]));
    }
    // Deeper immutable values than the depth limit are left to the graph check.
    internable = internable && height < limits_.max_depth + 1 && height < UINT16_MAX - 1;
    size_t slot = 0;
    uint64_t h = 0;
    const uint64_t k0 = stack_[from], k1 = n > 1 ? stack_[from + 1] : 0;
    if (internable) {
      h = Mix(2, n);
      for (size_t i = from; i < stack_.size(); ++i) h = Mix(h, stack_[i]);
      const uint64_t found = FindInterned(h, static_cast<uint32_t>(n), k0, k1, from, &slot);
      if (found != kAbsent) {
        stack_.resize(from);
        return found;
      }
    }
    uint64_t t = NewNode(Kind::kTuple);
    Node& node = NodeOf(t);
    node.first = static_cast<uint32_t>(out_.links_.size());
    node.count = static_cast<uint32_t>(n);
    for (size_t i = from; i < stack_.size(); ++i) out_.links_.push_back(stack_[i]);
    stack_.resize(from);
    node.height = height >= UINT16_MAX - 1 ? UINT16_MAX : static_cast<uint16_t>(height + 1);
    if (internable && slot != kNoSlot) Intern(t, slot, h, static_cast<uint32_t>(n), k0, k1, height + 1);
    return t;
  }
  uint64_t MakeCall(uint64_t callee, uint64_t args) {
    const bool cached = SharedTuple(args);
    if (cached && NodeOf(args).c == callee && NodeOf(args).b != kAbsent) return NodeOf(args).b;
    const uint64_t c = MakeCallSlow(callee, args);
    if (cached && (NodeOf(c).flags & kFlagShared) != 0) {
      NodeOf(args).b = c;
      NodeOf(args).c = callee;
    }
    return c;
  }
  uint64_t MakeCallSlow(uint64_t callee, uint64_t args) {
    size_t slot = 0;
    const uint16_t height = std::max(HeightOf(callee), HeightOf(args));
    const bool internable = Shareable(callee) && Shareable(args) &&
                            height < limits_.max_depth + 1 && height < UINT16_MAX - 1;
    const uint64_t h = Mix(Mix(1, callee), args);
    if (internable) {
      const uint64_t found = FindInterned(h, kCallKey, callee, args, 0, &slot);
      if (found != kAbsent) return found;
    }
    const uint64_t c = NewNode(Kind::kCall);
    NodeOf(c).a = callee;
    NodeOf(c).b = args;
    NodeOf(c).height = height >= UINT16_MAX - 1 ? UINT16_MAX : static_cast<uint16_t>(height + 1);
    if (internable && slot != kNoSlot) Intern(c, slot, h, kCallKey, callee, args, height + 1);
    return c;
  }
  uint64_t EmptyTuple() {
    if (empty_tuple_ == kAbsent) {
      empty_tuple_ = NewNode(Kind::kTuple);
      NodeOf(empty_tuple_).flags |= kFlagShared;
    }
    return empty_tuple_;
  }
  Status String(uint64_t n, bool bytes) {
    if (n > remaining()) return NotHere("operand passes the end");
    if (n > kMaxViewLength) return NotHere("string too long");
    stack_.push_back(uint64_t{pos_} << 32 | n << 3 | (bytes ? kTagBytes : kTagStr));
    pos_ += static_cast<size_t>(n);
    return Status::Ok();
  }
  Status Memoize(uint64_t key) {
    if (stack_.size() <= floor()) return NotHere("stack underflow");
    if (key >= memo_.size()) {
      // Writers number memo entries densely; a key far ahead is refused, and growth is
      // charged before it happens (each key may double the memo: twenty 5-byte opcodes
      // would otherwise ask for 2^32 slots before the periodic budget check).
      if (key >= 2 * memo_.size() + 4096) return NotHere("sparse memo key");
      if (BytesUsed() + (key + 1 - memo_.size()) * sizeof(uint64_t) > budget_) {
        return NotHere("memory budget");
      }
      while (memo_.size() <= key) memo_.push_back(kAbsent);
    }
    if (memo_[static_cast<size_t>(key)] == kAbsent) ++memo_count_;
    memo_[static_cast<size_t>(key)] = stack_.back();
    return Status::Ok();
  }
  Status MemoGet(uint64_t key) {
    if (key >= memo_.size() || memo_[static_cast<size_t>(key)] == kAbsent) {
      return NotHere("memo key not defined");
    }
    stack_.push_back(memo_[static_cast<size_t>(key)]);
    NoteReuse(stack_.back());
    return Status::Ok();
  }
  Status Fill(bool entries) {  // SETITEMS / APPENDS
    if (marks_.empty()) return NotHere("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    return FillFrom(m, entries);
  }
  // Adds stack_[m, end) to the container at stack_[m - 1].
  Status FillFrom(size_t m, bool entries) {
    if (m == 0 || m - 1 < floor()) return NotHere("stack underflow");
    const uint64_t target = stack_[m - 1];
    if (Tag(target) != kTagNode) return NotHere("fill of a scalar");
    Node& t = NodeOf(target);
    if (t.flags & kFlagShared) return NotHere("fill of a value shared by content");
    if (entries) {
      if ((stack_.size() - m) % 2 != 0) return NotHere("odd key/value count");
      if (t.kind != Kind::kDict && t.kind != Kind::kCall && t.kind != Kind::kObject) {
        return NotHere("setitems target");
      }
      if (t.kind != Kind::kDict) {
        if (t.flags & kFlagItems) return NotHere("items and entries on one object");
        t.flags |= kFlagEntries;
      }
    } else {
      if (t.kind != Kind::kList && t.kind != Kind::kCall && t.kind != Kind::kObject) {
        return NotHere("append target");
      }
      if (t.kind != Kind::kList) {
        if (t.flags & kFlagEntries) return NotHere("items and entries on one object");
        t.flags |= kFlagItems;
      }
    }
    AppendLinks(target, m);
    return Status::Ok();
  }
  Status Step(uint8_t op);
  // Step's handlers, one an opcode or a family of them (see Step).
  Status Proto();
  Status Frame();
  Status PopValueOrMark();
  Status PopToMark();
  Status Dup();
  Status BinInt(size_t width);
  Status Long1();
  Status BinFloat();
  Status LengthPrefixed(size_t width, bool bytes, bool signed_length);
  Status TupleOfTop(size_t n);
  Status TupleOfMarked();
  Status ListOrDictOfMarked(bool dict);
  Status TextGlobal();
  Status StackGlobal();
  Status CallOrObject(bool reduce);
  Status Build();
  Status MemoizeKey(size_t width);
  Status MemoGetKey(size_t width);
  Status CheckGraph(uint64_t ref, size_t depth);
  uint64_t BytesUsed() const {
    return out_.memory_bytes() + memo_.memory_bytes() + stack_.capacity() * 8 +
           marks_.capacity() * sizeof(size_t) + intern_.capacity() * sizeof(InternEntry);
  }

  std::span<const std::byte> data_;
  PickleLimits limits_;
  uint64_t budget_ = 0;
  const uint64_t hash_seed_ = HashSeed();
  size_t pos_ = 0;
  bool stopped_ = false;
  CompactPickle out_;
  std::vector<uint64_t> stack_;
  std::vector<size_t> marks_;
  CompactPickle::BlockArray<uint64_t> memo_;
  size_t memo_count_ = 0;
  std::vector<InternEntry> intern_ = std::vector<InternEntry>(1024);
  static constexpr size_t kRecent = 512;
  std::vector<InternEntry> recent_ = std::vector<InternEntry>(kRecent);
  size_t intern_count_ = 0;
  uint64_t empty_tuple_ = kAbsent;
  std::vector<uint8_t> graph_mark_;
  bool reused_mutable_ = false;
};

// Step reads the opcode's operand at pos_ and applies it. Opcodes of more than a line have
// a handler each (below), called directly: no table, no allocation per opcode. The handlers
// of the opcodes a big torch .metadata is made of (ints, strs, TUPLE1-3, REDUCE, NEWOBJ,
// BUILD, the memo) are inline; the rest are not, which leaves the compiler room to inline
// the stack's push_back into the hot ones.
Status CompactPickleMachine::Step(uint8_t op) {
  switch (op) {
    case kProto: return Proto();
    case kFrame: return Frame();
    case kStop:
      stopped_ = true;
      return Status::Ok();
    case kMark:
      marks_.push_back(stack_.size());
      return Status::Ok();
    case kPop: return PopValueOrMark();
    case kPopMark: return PopToMark();
    case kDup: return Dup();
    case kNone:
      stack_.push_back(kNoneBits);
      return Status::Ok();
    case kNewTrue:
    case kNewFalse:
      stack_.push_back(uint64_t{op == kNewTrue} << 3 | kTagBool);
      return Status::Ok();
    case kBinInt1: return BinInt(1);
    case kBinInt2: return BinInt(2);
    case kBinInt: return BinInt(4);
    case kLong1: return Long1();
    case kBinFloat: return BinFloat();
    case kShortBinUnicode:
    case kShortBinBytes:
    case kShortBinString: return LengthPrefixed(1, op == kShortBinBytes, false);
    case kBinUnicode:
    case kBinBytes:
    case kBinString: return LengthPrefixed(4, op == kBinBytes, op == kBinString);
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8: return LengthPrefixed(8, op != kBinUnicode8, false);
    case kEmptyTuple:
      stack_.push_back(EmptyTuple());
      return Status::Ok();
    case kTuple1:
    case kTuple2:
    case kTuple3: return TupleOfTop(static_cast<size_t>(op - kTuple1) + 1);
    case kTuple: return TupleOfMarked();
    case kList:
    case kDict: return ListOrDictOfMarked(op == kDict);
    case kEmptyList:
      stack_.push_back(NewNode(Kind::kList));
      return Status::Ok();
    case kEmptyDict:
      stack_.push_back(NewNode(Kind::kDict));
      return Status::Ok();
    case kAppend:
    case kSetItem: {
      const size_t n = op == kAppend ? 1 : 2;
      if (stack_.size() < floor() + n + 1) return NotHere("stack underflow");
      return FillFrom(stack_.size() - n, op == kSetItem);
    }
    case kAppends: return Fill(false);
    case kSetItems: return Fill(true);
    case kGlobal: return TextGlobal();
    case kStackGlobal: return StackGlobal();
    case kReduce:
    case kNewObj: return CallOrObject(op == kReduce);
    case kBuild: return Build();
    case kBinPut: return MemoizeKey(1);
    case kLongBinPut: return MemoizeKey(4);
    case kMemoize: return Memoize(memo_count_);
    case kBinGet: return MemoGetKey(1);
    case kLongBinGet: return MemoGetKey(4);
    default: return NotHere("opcode outside the subset");
  }
}

Status CompactPickleMachine::Proto() {
  uint64_t x = 0;
  if (!Read(1, &x)) return NotHere("truncated");
  if (x > 5) return NotHere("protocol");
  return Status::Ok();
}

Status CompactPickleMachine::Frame() {
  uint64_t x = 0;
  if (!Read(8, &x)) return NotHere("truncated");
  if (x > remaining()) return NotHere("frame passes the end");
  return Status::Ok();
}

// POP drops the top value, or (with no value above the innermost mark) the mark and what
// is above it, as Python does.
Status CompactPickleMachine::PopValueOrMark() {
  if (stack_.size() > floor()) {
    stack_.pop_back();
    return Status::Ok();
  }
  return PopToMark();
}

Status CompactPickleMachine::PopToMark() {
  if (marks_.empty()) return NotHere("no MARK");
  stack_.resize(marks_.back());
  marks_.pop_back();
  return Status::Ok();
}

Status CompactPickleMachine::Dup() {
  if (stack_.size() <= floor()) return NotHere("stack underflow");
  stack_.push_back(stack_.back());
  NoteReuse(stack_.back());
  return Status::Ok();
}

// BININT1 / BININT2 (unsigned) and BININT (signed 32-bit).
inline Status CompactPickleMachine::BinInt(size_t width) {
  uint64_t x = 0;
  if (!Read(width, &x)) return NotHere("truncated");
  if (width == 4) {
    stack_.push_back(PushInt(static_cast<int32_t>(static_cast<uint32_t>(x))));
  } else {
    stack_.push_back(PushInt(static_cast<int64_t>(x)));
  }
  return Status::Ok();
}

// LONG1 of at most 8 bytes (longer ints are outside the subset).
Status CompactPickleMachine::Long1() {
  uint64_t x = 0;
  if (!Read(1, &x)) return NotHere("truncated");
  const size_t n = static_cast<size_t>(x);
  if (n > 8) return NotHere("long int");
  uint64_t v = 0;
  if (!Read(n, &v)) return NotHere("truncated");
  if (n == 0) {
    stack_.push_back(PushInt(0));
    return Status::Ok();
  }
  if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  stack_.push_back(PushInt(static_cast<int64_t>(v)));
  return Status::Ok();
}

Status CompactPickleMachine::BinFloat() {
  if (remaining() < 8) return NotHere("truncated");
  uint64_t bits = 0;
  for (size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
  pos_ += 8;
  const uint64_t r = NewNode(Kind::kFloat);
  NodeOf(r).a = bits;
  stack_.push_back(r);
  return Status::Ok();
}

// A str or bytes whose length precedes it in `width` bytes (BINSTRING's is signed).
inline Status CompactPickleMachine::LengthPrefixed(size_t width, bool bytes,
                                                   bool signed_length) {
  uint64_t x = 0;
  if (!Read(width, &x)) return NotHere("truncated");
  if (signed_length && static_cast<int32_t>(static_cast<uint32_t>(x)) < 0) {
    return NotHere("negative length");
  }
  return String(x, bytes);
}

// TUPLE1..3: the top n values.
inline Status CompactPickleMachine::TupleOfTop(size_t n) {
  if (stack_.size() < floor() + n) return NotHere("stack underflow");
  const uint64_t t = MakeTuple(stack_.size() - n);
  stack_.push_back(t);
  return Status::Ok();
}

Status CompactPickleMachine::TupleOfMarked() {
  if (marks_.empty()) return NotHere("no MARK");
  const size_t m = marks_.back();
  marks_.pop_back();
  const uint64_t t = MakeTuple(m);
  stack_.push_back(t);
  return Status::Ok();
}

// LIST / DICT: a container of the values above the innermost mark.
Status CompactPickleMachine::ListOrDictOfMarked(bool dict) {
  if (marks_.empty()) return NotHere("no MARK");
  const size_t m = marks_.back();
  marks_.pop_back();
  if (dict && (stack_.size() - m) % 2 != 0) return NotHere("odd key/value count");
  const uint64_t c = NewNode(dict ? Kind::kDict : Kind::kList);
  AppendLinks(c, m);  // moves stack_[m, end) into the container
  stack_.push_back(c);
  return Status::Ok();
}

// GLOBAL: module and name, two text lines, kept as views of the input.
Status CompactPickleMachine::TextGlobal() {
  size_t lines[2];
  size_t start = pos_;
  for (size_t& end : lines) {
    size_t i = pos_;
    while (i < data_.size() && data_[i] != std::byte{'\n'}) ++i;
    if (i >= data_.size()) return NotHere("text operand without newline");
    end = i;
    pos_ = i + 1;
  }
  if (lines[0] - start > kMaxViewLength || lines[1] - lines[0] - 1 > kMaxViewLength) {
    return NotHere("name too long");
  }
  const uint64_t g = NewNode(Kind::kGlobal);
  NodeOf(g).a = uint64_t{start} << 32 | (lines[0] - start) << 3 | kTagStr;
  NodeOf(g).b = uint64_t{lines[0] + 1} << 32 | (lines[1] - lines[0] - 1) << 3 | kTagStr;
  stack_.push_back(g);
  return Status::Ok();
}

Status CompactPickleMachine::StackGlobal() {
  uint64_t name = 0, module = 0;
  if (!Pop(&name) || !Pop(&module)) return NotHere("stack underflow");
  if (Tag(name) != kTagStr || Tag(module) != kTagStr) return NotHere("global names");
  const uint64_t g = NewNode(Kind::kGlobal);
  NodeOf(g).a = module;
  NodeOf(g).b = name;
  stack_.push_back(g);
  return Status::Ok();
}

// REDUCE (a call, shared by content where it can be) or NEWOBJ (an object) of the callee
// and args tuple on top of the stack.
inline Status CompactPickleMachine::CallOrObject(bool reduce) {
  uint64_t args = 0, callee = 0;
  if (!Pop(&args) || !Pop(&callee)) return NotHere("stack underflow");
  if (Tag(args) != kTagNode || KindOf(args) != Kind::kTuple) return NotHere("args");
  if (reduce) {
    stack_.push_back(MakeCall(callee, args));
    return Status::Ok();
  }
  const uint64_t c = NewNode(Kind::kObject);
  NodeOf(c).a = callee;
  NodeOf(c).b = args;
  RaiseHeight(c, callee);
  RaiseHeight(c, args);
  stack_.push_back(c);
  return Status::Ok();
}

// BUILD: the popped value becomes the state of the object below it (once).
inline Status CompactPickleMachine::Build() {
  uint64_t state = 0;
  if (!Pop(&state)) return NotHere("stack underflow");
  if (stack_.size() <= floor()) return NotHere("stack underflow");
  const uint64_t target = stack_.back();
  if (Tag(target) != kTagNode) return NotHere("BUILD of a scalar");
  Node& t = NodeOf(target);
  if (t.kind != Kind::kObject && t.kind != Kind::kCall) return NotHere("BUILD target");
  if (t.flags & kFlagShared) return NotHere("BUILD of a value shared by content");
  if (t.c != kAbsent) return NotHere("second BUILD");
  t.c = state;
  RaiseHeight(target, state);
  return Status::Ok();
}

// BINPUT / LONG_BINPUT and BINGET / LONG_BINGET: a key of `width` bytes.
inline Status CompactPickleMachine::MemoizeKey(size_t width) {
  uint64_t x = 0;
  if (!Read(width, &x)) return NotHere("truncated");
  return Memoize(x);
}

inline Status CompactPickleMachine::MemoGetKey(size_t width) {
  uint64_t x = 0;
  if (!Read(width, &x)) return NotHere("truncated");
  return MemoGet(x);
}

Status CompactPickleMachine::CheckGraph(uint64_t ref, size_t depth) {
  if (Tag(ref) != kTagNode) return Status::Ok();
  const size_t i = static_cast<size_t>(ref >> 3);
  if (!IsContainer(out_.nodes_[i].kind)) return Status::Ok();
  if (depth > limits_.max_depth) return NotHere("nested too deep");
  if (out_.nodes_[i].flags & kFlagShared) {
    // Immutable and built from older values: no cycle through it; its height is known.
    if (depth + out_.nodes_[i].height - 1 > limits_.max_depth) return NotHere("nested too deep");
    return Status::Ok();
  }
  if (graph_mark_[i] == 2) return Status::Ok();
  if (graph_mark_[i] == 1) return NotHere("reference cycle");
  graph_mark_[i] = 1;
  Status st = Status::Ok();
  out_.ForEachLink(CompactPickle::Ref{ref}, [&](CompactPickle::Ref link) {
    if (Tag(link.bits) == kTagNode && st.ok()) st = CheckGraph(link.bits, depth + 1);
  });
  FC_RETURN_IF_ERROR(st);
  const Node& n = out_.nodes_[i];
  for (uint64_t c : {n.a, n.b, n.c}) {
    if (n.kind == Kind::kCall || n.kind == Kind::kObject) {
      FC_RETURN_IF_ERROR(CheckGraph(c, depth + 1));
    }
  }
  graph_mark_[i] = 2;
  return Status::Ok();
}

Result<CompactPickle> CompactPickleMachine::Run() {
  if (data_.size() >= (uint64_t{1} << 32)) return NotHere("input of 4 GiB or more");
  out_.data_ = data_;
  out_.segments_.push_back(Segment{});  // index 0 means "none"
  size_t next_check = 0;
  while (!stopped_) {
    if (pos_ >= data_.size()) return NotHere("no STOP");
    const auto op = static_cast<uint8_t>(data_[pos_++]);
    FC_RETURN_IF_ERROR(Step(op));
    if (pos_ >= next_check) {  // every 64 KiB of input, and at the end
      if (BytesUsed() > budget_) return NotHere("memory budget");
      next_check = pos_ + 65536;
    }
  }
  if (BytesUsed() > budget_) return NotHere("memory budget");
  uint64_t result = 0;
  if (!Pop(&result)) return NotHere("stack underflow");
  if (reused_mutable_) {
    graph_mark_.assign(out_.nodes_.size(), 0);
    FC_RETURN_IF_ERROR(CheckGraph(result, 0));
    graph_mark_ = {};
  } else if (HeightOf(result) > limits_.max_depth + 1) {
    return NotHere("nested too deep");
  }
  out_.root_ = CompactPickle::Ref{result};
  stack_ = {};
  memo_ = {};
  intern_ = {};
  return std::move(out_);
}

Result<CompactPickle> CompactPickle::Parse(std::span<const std::byte> data,
                                           const PickleLimits& limits) {
  CompactPickleMachine m(data, limits);
  return m.Run();
}

CompactPickle::Kind CompactPickle::kind(Ref r) const {
  switch (Tag(r.bits)) {
    case kTagNode: return nodes_[Index(r)].kind;
    case kTagInt: return Kind::kInt;
    case kTagNone: return Kind::kNone;
    case kTagBool: return Kind::kBool;
    case kTagStr: return Kind::kStr;
    case kTagBytes: return Kind::kBytes;
    default: return Kind::kNone;  // absent: callers check absent() first
  }
}

int64_t CompactPickle::int_value(Ref r) const {
  if (Tag(r.bits) == kTagInt) return static_cast<int64_t>(r.bits) >> 3;
  return static_cast<int64_t>(nodes_[Index(r)].a);
}

double CompactPickle::float_value(Ref r) const {
  return std::bit_cast<double>(nodes_[Index(r)].a);
}

std::string_view CompactPickle::str(Ref r) const {
  const size_t offset = static_cast<size_t>(r.bits >> 32);
  const size_t length = static_cast<size_t>((r.bits >> 3) & kMaxViewLength);
  return std::string_view(reinterpret_cast<const char*>(data_.data()) + offset, length);
}

uint64_t CompactPickle::bytes_offset(Ref r) const { return r.bits >> 32; }

std::string_view CompactPickle::global_module(Ref r) const { return str(Ref{nodes_[Index(r)].a}); }
std::string_view CompactPickle::global_name(Ref r) const { return str(Ref{nodes_[Index(r)].b}); }

CompactPickle::Ref CompactPickle::CalleeGlobal(Ref r) const {
  if (r.absent() || Tag(r.bits) != kTagNode) return Ref{};
  const Node& n = nodes_[Index(r)];
  if (n.kind != Kind::kCall && n.kind != Kind::kObject) return Ref{};
  const Ref c{n.a};
  if (Tag(c.bits) != kTagNode || nodes_[Index(c)].kind != Kind::kGlobal) return Ref{};
  return c;
}

size_t CompactPickle::size(Ref r) const {
  if (Tag(r.bits) != kTagNode) return 0;
  return nodes_[Index(r)].count;
}

bool CompactPickle::has_entries(Ref r) const {
  if (Tag(r.bits) != kTagNode) return false;
  const Node& n = nodes_[Index(r)];
  return n.kind == Kind::kDict || (n.flags & kFlagEntries) != 0;
}

Result<PickleValue::Ptr> CompactPickle::ToPickleValue(Ref root, uint64_t budget_bytes) const {
  // Depth is bounded by Parse's graph check, so recursion is safe; the map keeps shared
  // nodes shared and turns repeated views of one string into one node.
  std::unordered_map<uint64_t, PickleValue::Ptr> done;
  uint64_t charged = 0;
  auto convert = [&](auto&& self, Ref r) -> PickleValue::Ptr {
    if (auto it = done.find(r.bits); it != done.end()) return it->second;
    // The node, its control block and map entry, its links; strings below.
    charged += sizeof(PickleValue) + 96;
    if (Tag(r.bits) == kTagNode) charged += uint64_t{nodes_[Index(r)].count} * 16;
    if (charged > budget_bytes) return nullptr;  // the caller reports it
    auto v = std::make_shared<PickleValue>();
    v->kind = kind(r);
    switch (v->kind) {
      case Kind::kNone: break;
      case Kind::kBool: v->bool_value = bool_value(r); break;
      case Kind::kInt: v->int_value = int_value(r); break;
      case Kind::kFloat: v->float_value = float_value(r); break;
      case Kind::kStr:
        charged += str(r).size();
        if (charged > budget_bytes) return nullptr;
        v->str = std::string(str(r));
        break;
      case Kind::kBytes:
        charged += str(r).size();
        if (charged > budget_bytes) return nullptr;
        v->str = std::string(str(r));
        v->bytes_offset = bytes_offset(r);
        v->bytes_length = v->str.size();
        break;
      case Kind::kGlobal:
        v->str = std::string(global_module(r));
        v->name = std::string(global_name(r));
        break;
      default: {
        const Node& n = nodes_[Index(r)];
        if (v->kind == Kind::kCall || v->kind == Kind::kObject) {
          if (!Ref{n.a}.absent()) v->callee = self(self, Ref{n.a});
          if (!Ref{n.b}.absent()) v->args = self(self, Ref{n.b});
          if (!Ref{n.c}.absent()) v->state = self(self, Ref{n.c});
        }
        std::vector<PickleValue::Ptr> links;
        links.reserve(n.count);
        ForEachLink(r, [&](Ref link) { links.push_back(self(self, link)); });
        if (has_entries(r)) {
          v->entries.reserve(links.size() / 2);
          for (size_t i = 0; i + 1 < links.size(); i += 2) {
            v->entries.emplace_back(links[i], links[i + 1]);
          }
        } else {
          v->items = std::move(links);
        }
      }
    }
    PickleValue::Ptr p = std::move(v);
    done.emplace(r.bits, p);
    return p;
  };
  if (root.absent()) return PickleValue::Ptr();
  PickleValue::Ptr out = convert(convert, root);
  if (charged > budget_bytes) {
    return ResourceExhaustedError("compact pickle: the value kept as a general tree would take "
                                  "more than " + std::to_string(budget_bytes >> 20) + " MiB");
  }
  return out;
}

uint64_t CompactPickle::memory_bytes() const {
  return nodes_.memory_bytes() + links_.memory_bytes() + segments_.memory_bytes();
}

}  // namespace fc
