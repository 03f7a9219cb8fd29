// Pickle emitter. Layout and contract: fc/codec/pickle_writer.h.
//
// Framing follows CPython's _Framer: a frame is closed at the first opcode boundary at or
// after 64 KiB, and the last frame is closed by Finish() (with STOP inside it). A frame
// must not split an opcode's operand: CPython's unpickler refuses "pickle exhausted before
// end of frame". Frames shorter than 4 bytes get no header (CPython's _FRAME_SIZE_MIN).
#include "fc/codec/pickle_writer.h"

#include <cassert>
#include <cstring>

#include "src/codec/pickle_opcodes.h"

namespace fc::internal_torch {
namespace {

constexpr size_t kFrameSizeTarget = 64 * 1024;
constexpr size_t kFrameSizeMin = 4;
constexpr size_t kFrameHeader = 9;  // FRAME opcode + u64

}  // namespace

PickleWriter::PickleWriter(int protocol) : protocol_(protocol) {
  assert(protocol == 2 || protocol == 4);
  Op(kProto);
  out_.push_back(static_cast<char>(protocol));
  if (protocol_ >= 4) {
    frame_start_ = out_.size();
    out_.append(kFrameHeader, '\0');  // patched by CloseFrame
  }
}

void PickleWriter::Op(uint8_t op) { out_.push_back(static_cast<char>(op)); }

void PickleWriter::PutLe(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PickleWriter::EndOp() {
  if (protocol_ >= 4 && out_.size() - frame_start_ - kFrameHeader >= kFrameSizeTarget) {
    CloseFrame();
    frame_start_ = out_.size();
    out_.append(kFrameHeader, '\0');
  }
}

void PickleWriter::CloseFrame() {
  const size_t len = out_.size() - frame_start_ - kFrameHeader;
  if (len < kFrameSizeMin) {
    out_.erase(frame_start_, kFrameHeader);
    return;
  }
  out_[frame_start_] = static_cast<char>(kFrame);
  for (int i = 0; i < 8; ++i) {
    out_[frame_start_ + 1 + i] = static_cast<char>((static_cast<uint64_t>(len) >> (8 * i)) & 0xff);
  }
}

PickleWriter& PickleWriter::None() {
  Op(kNone);
  EndOp();
  return *this;
}

PickleWriter& PickleWriter::Bool(bool b) {
  Op(b ? kNewTrue : kNewFalse);
  EndOp();
  return *this;
}

PickleWriter& PickleWriter::Int(int64_t v) {
  if (v >= 0 && v <= 0xff) {
    Op(kBinInt1);
    PutLe(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    Op(kBinInt2);
    PutLe(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    Op(kBinInt);
    PutLe(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    // LONG1: minimal two's-complement little-endian (CPython's encode_long).
    std::string bytes;
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    while (bytes.size() > 1) {
      const auto last = static_cast<uint8_t>(bytes.back());
      const auto prev = static_cast<uint8_t>(bytes[bytes.size() - 2]);
      const bool redundant = (v >= 0 && last == 0x00 && (prev & 0x80) == 0) ||
                             (v < 0 && last == 0xff && (prev & 0x80) != 0);
      if (!redundant) break;
      bytes.pop_back();
    }
    Op(kLong1);
    out_.push_back(static_cast<char>(bytes.size()));
    out_ += bytes;
  }
  EndOp();
  return *this;
}

PickleWriter& PickleWriter::Float(double v) {
  Op(kBinFloat);  // the only float opcode CPython writes (protocols >= 1)
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(v));
  std::memcpy(&bits, &v, sizeof(bits));
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  EndOp();
  return *this;
}

PickleWriter& PickleWriter::Str(std::string_view s) {
  if (protocol_ >= 4 && s.size() < 256) {
    Op(kShortBinUnicode);
    PutLe(s.size(), 1);
  } else if (s.size() <= 0xffffffffu) {
    Op(kBinUnicode);
    PutLe(s.size(), 4);
  } else {
    Op(kBinUnicode8);
    PutLe(s.size(), 8);
  }
  out_.append(s);
  EndOp();
  return *this;
}

void PickleWriter::Get(uint64_t memo_index) {
  if (memo_index < 256) {
    Op(kBinGet);
    PutLe(memo_index, 1);
  } else {
    Op(kLongBinGet);
    PutLe(memo_index, 4);
  }
  EndOp();
}

PickleWriter& PickleWriter::Global(std::string_view module, std::string_view name) {
  auto key = std::make_pair(std::string(module), std::string(name));
  if (auto it = global_memo_.find(key); it != global_memo_.end()) {
    Get(it->second);
    return *this;
  }
  if (protocol_ >= 4) {
    if (auto it = module_memo_.find(module); it != module_memo_.end()) {
      Get(it->second);
    } else {
      Str(module);
      module_memo_.emplace(std::string(module), memo_size_);
      Memoize();
    }
    Str(name);
    Memoize();
    Op(kStackGlobal);
    EndOp();
  } else {
    Op(kGlobal);
    out_.append(module);
    out_.push_back('\n');
    out_.append(name);
    out_.push_back('\n');
    EndOp();
  }
  global_memo_.emplace(std::move(key), memo_size_);
  Memoize();
  return *this;
}

PickleWriter& PickleWriter::Memoize() {
  if (protocol_ >= 4) {
    Op(kMemoize);
  } else if (memo_size_ < 256) {
    Op(kBinPut);
    PutLe(memo_size_, 1);
  } else {
    Op(kLongBinPut);
    PutLe(memo_size_, 4);
  }
  ++memo_size_;
  EndOp();
  return *this;
}

#define FC_PICKLE_SIMPLE_OP(Method, opcode) \
  PickleWriter& PickleWriter::Method() {    \
    Op(opcode);                             \
    EndOp();                                \
    return *this;                           \
  }
FC_PICKLE_SIMPLE_OP(Mark, kMark)
FC_PICKLE_SIMPLE_OP(EmptyTuple, kEmptyTuple)
FC_PICKLE_SIMPLE_OP(EmptyList, kEmptyList)
FC_PICKLE_SIMPLE_OP(EmptyDict, kEmptyDict)
FC_PICKLE_SIMPLE_OP(Append, kAppend)
FC_PICKLE_SIMPLE_OP(Appends, kAppends)
FC_PICKLE_SIMPLE_OP(SetItem, kSetItem)
FC_PICKLE_SIMPLE_OP(SetItems, kSetItems)
FC_PICKLE_SIMPLE_OP(Reduce, kReduce)
FC_PICKLE_SIMPLE_OP(NewObj, kNewObj)
FC_PICKLE_SIMPLE_OP(Build, kBuild)
FC_PICKLE_SIMPLE_OP(BinPersId, kBinPersId)
#undef FC_PICKLE_SIMPLE_OP

PickleWriter& PickleWriter::TupleOf(size_t n) {
  assert(n > 0);
  Op(n == 1 ? kTuple1 : n == 2 ? kTuple2 : n == 3 ? kTuple3 : kTuple);
  EndOp();
  return *this;
}

std::string PickleWriter::Finish() {
  Op(kStop);
  if (protocol_ >= 4) CloseFrame();
  return std::move(out_);
}

}  // namespace fc::internal_torch
