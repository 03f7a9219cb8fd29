// CompactPickle: a pickle parsed into flat arrays, for pickles with millions of values
// (a torch DCP `.metadata` of 1M chunks holds ~30M). Private to src/; the general reader
// with the public value tree is fc/codec/pickle.h.
//
// What it accepts: the binary subset that pickle protocols 2-5 emit for plain data and
// objects (PROTO, FRAME, MARK, POP, POP_MARK, DUP, None/True/False, BININT*, LONG1 up to
// 8 bytes within int64, BINFLOAT, the binary str/bytes opcodes, tuples, lists, dicts,
// APPEND(S), SETITEM(S), GLOBAL, STACK_GLOBAL, REDUCE, NEWOBJ, one BUILD per object,
// BINPUT/LONG_BINPUT/MEMOIZE, BINGET/LONG_BINGET with dense keys). Everything else (text
// opcodes, big ints, sets, persistent ids, INST/OBJ, NEWOBJ_EX, a second BUILD, sparse memo
// keys, inputs of 4 GiB or more), every malformed input, a reference cycle, nesting deeper
// than PickleLimits::max_depth and passing the memory budget give an error whose only
// meaning is "not decoded here": callers then use ParsePickle, which gives the error or the
// value. So the messages here are short and not part of any contract.
//
// Values are what ParsePickle would give (same kinds, same sharing through the memo).
// Immutable values are shared by content, as ParsePickle does: tuples of up to 8 scalars,
// string views, globals or such tuples and calls, and REDUCE calls of such a callee on
// such args (torch.Size((8, 6)), repeated for every chunk), found through an open-addressing
// table; filling or BUILDing a shared call is outside the subset. Strings and bytes are
// views into the input, which must outlive the CompactPickle.
//
// Memory: a node (container, global, float, large int) is 40 bytes, a link 8, a memo slot
// 8; all in fixed blocks. The budget is 8 bytes per input byte + 32 MiB, checked as it
// grows. A torch DCP .metadata takes about 440 bytes a chunk (0.45 GB for 1M chunks, whose
// .metadata is 178 MB: 2.5 bytes per input byte). A file past the budget goes to the
// general decoder (ParsePickle), whose own budget then refuses it or reads it.
//
// Cycles and depth are refused as ParsePickle refuses them. When no list, dict, object or
// unshared call is pushed twice (BINGET, DUP), the value is a tree of subtrees final when
// linked, and the depth is the root's height, kept while linking; otherwise the whole
// graph is walked.
//
// Thread-safety: a parsed CompactPickle is immutable and may be read from several threads.
#ifndef FC_SRC_CODEC_COMPACT_PICKLE_H_
#define FC_SRC_CODEC_COMPACT_PICKLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"

namespace fc {

class CompactPickle {
 public:
  using Kind = PickleValue::Kind;  // kBigInt, kSet and kPersId never occur
  // A value: a tagged word (a node index, an inline int, None, a bool, a string view).
  struct Ref {
    uint64_t bits = kAbsentBits;
    bool absent() const { return bits == kAbsentBits; }  // e.g. an object without BUILD
    friend bool operator==(Ref, Ref) = default;
  };

  static Result<CompactPickle> Parse(std::span<const std::byte> data,
                                     const PickleLimits& limits = {});

  Ref root() const { return root_; }
  // Precondition for all accessors below: the ref is not absent and of the named kind.
  Kind kind(Ref r) const;
  int64_t int_value(Ref r) const;
  bool bool_value(Ref r) const { return ((r.bits >> 3) & 1) != 0; }
  double float_value(Ref r) const;
  std::string_view str(Ref r) const;  // kStr, kBytes: the bytes, a view into the input
  uint64_t bytes_offset(Ref r) const;  // kStr, kBytes: where they lie in the input
  std::string_view global_module(Ref r) const;
  std::string_view global_name(Ref r) const;
  // kCall / kObject: callee, args (a tuple) and state (absent without BUILD).
  Ref callee(Ref r) const { return Ref{nodes_[Index(r)].a}; }
  Ref args(Ref r) const { return Ref{nodes_[Index(r)].b}; }
  Ref state(Ref r) const { return Ref{nodes_[Index(r)].c}; }
  // For a kCall/kObject whose callee is a kGlobal: the callee; otherwise an absent Ref.
  Ref CalleeGlobal(Ref r) const;
  bool IsGlobal(Ref r, std::string_view module, std::string_view name) const {
    return !r.absent() && kind(r) == Kind::kGlobal && global_module(r) == module &&
           global_name(r) == name;
  }

  // The links of a container in order: a tuple's or list's items, a dict's keys and values
  // alternating (k0, v0, k1, v1, ...). kCall/kObject nodes filled by APPEND(S) have items,
  // by SETITEM(S) entries (see has_entries); other kinds have none.
  size_t size(Ref r) const;  // number of links
  bool has_entries(Ref r) const;
  template <typename F>  // f(Ref link) for each link in order
  void ForEachLink(Ref r, F&& f) const {
    const Node& n = nodes_[Index(r)];
    if (n.kind == Kind::kTuple) {
      for (uint32_t i = 0; i < n.count; ++i) f(Ref{links_[n.first + i]});
      return;
    }
    for (uint32_t s = n.first; s != 0; s = segments_[s].next) {
      const Segment& seg = segments_[s];
      for (uint32_t i = 0; i < seg.count; ++i) f(Ref{links_[seg.start + i]});
    }
  }
  // Links of a tuple by position (tuples are stored contiguously).
  Ref TupleItem(Ref r, size_t i) const { return Ref{links_[nodes_[Index(r)].first + i]}; }

  // The value as a PickleValue tree (for the parts a caller keeps as general values).
  // Shared nodes stay shared, equal string views become one node. kResourceExhausted when
  // the tree would take more than `budget_bytes` (counted as the general decoder counts:
  // a general node costs several compact ones).
  Result<PickleValue::Ptr> ToPickleValue(Ref r, uint64_t budget_bytes) const;

  // Bytes of the pickle this was decoded from.
  uint64_t input_size() const { return data_.size(); }

  // Bytes held by the arrays (for benchmarks and tests).
  uint64_t memory_bytes() const;

 private:
  static constexpr uint64_t kAbsentBits = 7;
  struct Node {  // 40 bytes
    Kind kind;
    uint8_t flags;        // entries or items; shared by content
    uint16_t height = 0;  // values shared by content: container levels, itself included
    uint32_t count = 0;   // links (tuple: all; others: sum over segments)
    uint32_t first = 0;   // tuple: index of the first link; others: the first segment (0: none)
    uint32_t last = 0;    // the last segment (others)
    uint64_t a = kAbsentBits;  // call/object: callee; global: module; float: bits; int: value
    uint64_t b = kAbsentBits;  // call/object: args; global: name; str node: length
    uint64_t c = kAbsentBits;  // call/object: state
  };
  struct Segment {
    uint32_t start = 0;  // index in links_
    uint32_t count = 0;
    uint32_t next = 0;   // 0: none
  };
  // An array in fixed blocks: growing it never copies (a doubling vector of 500 MB would
  // briefly hold 1.5 GB), and untouched capacity is at most one block. A block's storage is
  // not initialised (every element is written by push_back before it is read): zeroing
  // 2 MB of blocks per parse made small pickles cost page faults and memset, not decoding.
  template <typename T>
  class BlockArray {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
    struct FreeStorage {
      void operator()(T* p) const { ::operator delete(p); }
    };

   public:
    static constexpr size_t kShift = 13;  // 8192 elements a block (320 KiB of nodes)
    static constexpr size_t kBlock = size_t{1} << kShift;
    size_t size() const { return size_; }
    T& operator[](size_t i) { return blocks_[i >> kShift].get()[i & (kBlock - 1)]; }
    const T& operator[](size_t i) const {
      return blocks_[i >> kShift].get()[i & (kBlock - 1)];
    }
    void push_back(const T& v) {
      if ((size_ & (kBlock - 1)) == 0) {
        blocks_.emplace_back(static_cast<T*>(::operator new(kBlock * sizeof(T))));
      }
      (*this)[size_++] = v;
    }
    uint64_t memory_bytes() const {
      return blocks_.size() * kBlock * sizeof(T) + blocks_.capacity() * sizeof(void*);
    }

   private:
    std::vector<std::unique_ptr<T, FreeStorage>> blocks_;
    size_t size_ = 0;
  };
  friend class CompactPickleMachine;

  static size_t Index(Ref r) { return static_cast<size_t>(r.bits >> 3); }

  std::span<const std::byte> data_;
  BlockArray<Node> nodes_;
  BlockArray<uint64_t> links_;
  BlockArray<Segment> segments_;  // [0] unused: 0 means "none"
  Ref root_;
};

}  // namespace fc

#endif  // FC_SRC_CODEC_COMPACT_PICKLE_H_
