// A pickle emitter for the two pickles fc writes for PyTorch: torch.save `data.pkl`
// (protocol 2) and DCP `.metadata` (protocol 4). Used by the torch writers; the reader is
// fc/codec/pickle.h, whose opcode table (shared/reference/formats.md 1.1) this follows.
//
// Byte layout produced:
//   protocol 2:  PROTO 2, opcodes, STOP. Strings are BINUNICODE ('X' u32 len), globals are
//                GLOBAL ('c' "module\nname\n"), the memo is filled with BINPUT ('q' u8 /
//                'r' u32) exactly where Memoize() is called.
//   protocol 4:  PROTO 4, then the opcodes cut into FRAMEs (0x95 u64 len) of about 64 KiB,
//                each ending on an opcode boundary, as CPython's framer does; strings are
//                SHORT_BINUNICODE / BINUNICODE / BINUNICODE8 by length, globals are
//                STACK_GLOBAL of two memoized strings, the memo is filled with MEMOIZE.
//   Integers use the smallest of BININT1 / BININT2 / BININT / LONG1, as CPython does.
//
// Globals are memoized on first use and fetched with BINGET / LONG_BINGET afterwards, so a
// .metadata naming `torch.Size` ten thousand times spells it once (as CPython's output).
//
// Thread-safety: none; one writer per pickle.
#ifndef FC_CODEC_PICKLE_WRITER_H_
#define FC_CODEC_PICKLE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace fc::internal_torch {

class PickleWriter {
 public:
  // protocol: 2 or 4. Writes the PROTO opcode.
  explicit PickleWriter(int protocol);

  PickleWriter& None();
  PickleWriter& Bool(bool b);                 // NEWTRUE / NEWFALSE
  PickleWriter& Int(int64_t v);
  PickleWriter& Float(double v);              // BINFLOAT (big-endian IEEE double)
  PickleWriter& Str(std::string_view s);      // not memoized
  // A class or function reference, memoized: the second reference is a memo fetch.
  PickleWriter& Global(std::string_view module, std::string_view name);
  PickleWriter& Mark();
  PickleWriter& EmptyTuple();
  PickleWriter& EmptyList();
  PickleWriter& EmptyDict();
  // TUPLE1/2/3 for n <= 3 (no mark), otherwise TUPLE (items since the last Mark()).
  // For n == 0 use EmptyTuple().
  PickleWriter& TupleOf(size_t n);
  PickleWriter& Append();      // list.append(top)
  PickleWriter& Appends();     // items since mark
  PickleWriter& SetItem();     // dict[k] = v
  PickleWriter& SetItems();    // pairs since mark
  PickleWriter& Reduce();
  PickleWriter& NewObj();
  PickleWriter& Build();
  PickleWriter& BinPersId();
  // Stores the top of the stack in the next memo slot (BINPUT n or MEMOIZE).
  PickleWriter& Memoize();

  // Emits STOP, closes the last frame, and returns the pickle. The writer is spent.
  std::string Finish();
  // Bytes written so far.
  size_t bytes() const { return out_.size(); }

  // CPython's batch size for APPENDS / SETITEMS.
  static constexpr size_t kBatchSize = 1000;

 private:
  void Op(uint8_t op);
  void PutLe(uint64_t v, int bytes);
  // Called after every complete opcode: closes the current frame once it is large enough.
  void EndOp();
  void CloseFrame();
  void Get(uint64_t memo_index);

  int protocol_;
  std::string out_;
  size_t frame_start_ = 0;  // position of the current frame's 9-byte header (protocol 4)
  uint64_t memo_size_ = 0;
  std::map<std::pair<std::string, std::string>, uint64_t> global_memo_;
  std::map<std::string, uint64_t, std::less<>> module_memo_;  // protocol 4 module strings
};

}  // namespace fc::internal_torch

#endif  // FC_CODEC_PICKLE_WRITER_H_
