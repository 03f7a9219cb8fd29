// A Python pickle reader that never executes anything: a small stack machine that turns a
// pickle byte stream into a generic value tree, for torch DCP `.metadata`, torch.save
// `data.pkl` and similar files.
//
// Byte layout (Python's pickle protocols 0-5; see shared/reference/formats.md section 1):
//   1. optional PROTO  0x80 u8               protocol number, 0..5
//   2. opcodes, each one byte, followed by its operand:
//        FRAME 0x95 u64                       protocol 4+ framing; skipped (data continues inline)
//        ints      K u8 | M u16 | J i32 | LONG1 0x8a u8 n + n bytes | LONG4 0x8b i32 n + n bytes
//                  (LONG*: two's-complement little-endian; n == 0 means 0)
//        float     G 8 bytes BIG-endian IEEE double | F decimal text line
//        strings   X u32 | 0x8c u8 | 0x8d u64 length, then UTF-8
//        bytes     C u8 | B u32 | 0x8e u64 | 0x96 u64 (bytearray) length, then raw bytes
//        globals   c "module\nname\n" | 0x93 STACK_GLOBAL (pops name, then module)
//        building  ( MARK, ) } ] empties, t 0x85-0x87 tuples, a e APPEND(S), s u SETITEM(S),
//                  0x8f 0x90 0x91 sets, R REDUCE, 0x81 NEWOBJ, 0x92 NEWOBJ_EX, b BUILD,
//                  i INST, o OBJ, Q BINPERSID, P PERSID
//        memo      q u8 | r u32 | p text PUT; 0x94 MEMOIZE; h u8 | j u32 | g text GET
//        misc      N None, 0x88/0x89 True/False, 0 POP, 1 POP_MARK, 2 DUP, I/L text ints
//   3. STOP '.'   the value on top of the stack is the result; trailing bytes are ignored.
// Little-endian everywhere except BINFLOAT. Unsupported (kUnimplemented): EXT1/2/4 (the
// copyreg extension registry), NEXT_BUFFER / READONLY_BUFFER (out-of-band buffers),
// integer text literals of more than 4300 digits (as CPython), protocol > 5.
//
// The value tree. Nothing is called: REDUCE becomes a kCall node (callable + args tuple),
// NEWOBJ a kObject node (class + args), BUILD stores its argument as the node's `state`,
// and SETITEM(S)/APPEND(S) applied to a kCall/kObject node (e.g. an OrderedDict built by
// REDUCE) land in its `entries`/`items`. Interpreting the tree (which globals are allowed,
// what a kCall of `torch.Size` means) is the caller's job.
//
// Sharing: values reached through the memo are shared (the tree is a DAG), exactly as in
// Python; walk it by reference and do not assume a node has one parent. Immutable values
// are also shared by content: equal ints, equal strs of up to 256 bytes, equal globals,
// equal tuples of up to 8 such values, and equal REDUCE calls of such a callable on such
// an args tuple (torch.Size((8, 6))) are one node each (so node identity says nothing
// about the memo). A shared call that is later memoized, duplicated or filled (BUILD,
// SETITEM(S), APPEND(S)) is copied first, so what a caller sees is exactly Python's value.
// Reference cycles (a list containing itself) are rejected with kUnimplemented, so every
// walk terminates.
//
// Limits (distrust every size): operand lengths are checked against the remaining input,
// nesting depth of the result is bounded (PickleLimits::max_depth), and the bytes the tree
// takes are bounded by a budget proportional to the input size (PickleLimits
// max_tree_bytes_*). Values reached through the memo are shared, never copied, so a value
// referenced a million times costs a million links, not a million copies. Errors are
// kDataLoss for malformed input ("pickle: BINGET at byte 17: memo key 9 not defined"),
// kUnimplemented for valid pickles outside the subset above, kResourceExhausted past the
// memory budget.
//
// Thread-safety: ParsePickle is a pure function; a parsed tree is immutable and may be read
// from several threads.
#ifndef FC_CODEC_PICKLE_H_
#define FC_CODEC_PICKLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fc/core/status.h"

namespace fc {

struct PickleValue {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,     // fits int64: int_value
    kBigInt,  // outside int64: str holds the minimal two's-complement little-endian bytes
    kFloat,
    kStr,     // str holds UTF-8 (not re-validated)
    kBytes,   // str holds the raw bytes (bytes or bytearray)
    kTuple,   // items
    kList,    // items
    kDict,    // entries, in insertion order; keys may be any value; duplicates are kept
    kSet,     // items; bool_value is true for a frozenset
    kGlobal,  // str = module, name = qualified name, e.g. ("torch", "float32")
    kCall,    // REDUCE: callee(*args); may also carry state/items/entries (see above)
    kObject,  // NEWOBJ / NEWOBJ_EX / INST / OBJ: callee = class, args, kwargs, state
    kPersId,  // persistent id: callee = the pid value (torch.save: a 5-tuple)
  };
  using Ptr = std::shared_ptr<const PickleValue>;

  // Layout: a big .metadata holds millions of nodes, so the scalars are packed (kind and
  // flags share one word; a node is an int, a float or bytes, never two of them).
  Kind kind = Kind::kNone;
  bool bool_value = false;
  // Scratch for ParsePickle's cycle check; meaningless to callers.
  mutable uint8_t graph_mark = 0;
  // Set by ParsePickle on values it shares by content (see Sharing); meaningless to callers.
  bool content_shared = false;
  union {
    int64_t int_value = 0;  // kInt
    double float_value;     // kFloat
    uint64_t bytes_offset;  // kBytes, see below
  };
  std::string str;
  std::string name;
  std::vector<Ptr> items;
  std::vector<std::pair<Ptr, Ptr>> entries;
  Ptr callee;
  Ptr args;
  Ptr kwargs;
  Ptr state;
  // kBytes: where the payload lies in the parsed input (bytes_offset, above, and
  // bytes_length). When it is longer than PickleLimits::max_inline_bytes, `str` stays empty
  // and the caller reads it from there.
  uint64_t bytes_length = 0;

  bool is_none() const { return kind == Kind::kNone; }
  bool is_int() const { return kind == Kind::kInt; }
  bool is_str() const { return kind == Kind::kStr; }
  bool is_tuple() const { return kind == Kind::kTuple; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  // True for a kGlobal with exactly this module and name.
  bool IsGlobal(std::string_view module, std::string_view global_name) const {
    return kind == Kind::kGlobal && str == module && name == global_name;
  }
  // For a kCall / kObject whose callee is a kGlobal: that global; otherwise nullptr.
  const PickleValue* CalleeGlobal() const;

  // Dict lookup by string key (the last entry with that key wins, as in Python).
  // Works on kDict and on the `entries` of kCall/kObject nodes. nullptr when absent.
  const PickleValue* Find(std::string_view key) const;

  // A short human-readable rendering for error messages, cut at about `max_chars`,
  // e.g. "torch.Size((8, 6))" or "{'fqn': 'w', ...}". Bounded in time by max_chars.
  std::string DebugString(size_t max_chars = 120) const;
};

std::string_view PickleKindName(PickleValue::Kind kind);

struct PickleLimits {
  size_t max_depth = 512;  // nesting of containers/objects in the result
  // bytes/bytearray payloads longer than this are not copied into the tree (see
  // PickleValue::bytes_offset): pickles holding tensor data (paddle.save) are parsed from a
  // memory map without touching the data pages.
  uint64_t max_inline_bytes = UINT64_MAX;
  // Memory budget of the value tree, counted in bytes (nodes ~220 bytes each, links, string
  // bytes), not in values: base + per_input_byte * input size. A 1M-chunk torch DCP
  // .metadata (178 MB) needs about 10 bytes of tree per input byte; a pickle of nothing but
  // tiny containers ("]]]]...") about 300, which this refuses. 16 and 32 MiB keep the peak
  // memory of reading any metadata file (tree plus the file's bytes, plus what the allocator
  // keeps: jemalloc, which the tools link, holds ~15% more than glibc for a tree of small
  // nodes) under 20 x its size + 64 MiB (tests/tools/metadata_memory_test.py).
  uint64_t max_tree_bytes_per_input_byte = 16;
  uint64_t max_tree_bytes_base = uint64_t{32} << 20;
};

// Runs the pickle in `data` and returns the value left by STOP.
// Errors: kDataLoss for malformed or truncated input (message names the opcode and its
// byte position), kUnimplemented for the unsupported features listed above, a reference
// cycle, or nesting deeper than limits.max_depth; kResourceExhausted when the tree would
// pass the memory budget (limits.max_tree_bytes_*).
Result<PickleValue> ParsePickle(std::span<const std::byte> data, const PickleLimits& limits = {});
// The same, for a pickle followed by more data (legacy torch.save writes several pickles
// back to back): *consumed is the pickle's length, up to and including STOP.
Result<PickleValue> ParsePickle(std::span<const std::byte> data, const PickleLimits& limits,
                                size_t* consumed);

}  // namespace fc

#endif  // FC_CODEC_PICKLE_H_
