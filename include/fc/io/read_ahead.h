// Read-ahead advice for a file read as several sequential streams at once. Pure: no IO.
//
// Contract: ReadAheadStreams sees every read of one file (offset, length), in the order they
// are issued, and answers with the byte range the caller should ask the kernel to start
// reading now (posix_fadvise POSIX_FADV_WILLNEED), or nothing. It follows up to kMaxStreams
// streams: a read that starts within `ahead` bytes before or after where a stream's furthest
// read ended continues that stream (two workers taking alternate slabs of one run make one
// stream); any other read starts a new stream, replacing the least recently used. The first
// read of a stream is never advised on (a parser's lone read is not a stream); from the
// second on, the stream is kept advised up to `ahead` bytes past its end, in steps of at
// least ahead / 2, never past the file's size. It also names, in steps of at least ahead / 2,
// the bytes the stream has read that a caller dropping what it read may now drop: from where
// the last such range ended (the stream's first offset at first) to ahead / 4 short of the
// stream's end, so slabs that other workers read a little out of order are not dropped
// under them; once the stream reaches the end of the file, all of it. Never any byte at or
// after the read being reported (the advice comes before that read).
// Not thread-safe: the caller serialises.
#ifndef FC_IO_READ_AHEAD_H_
#define FC_IO_READ_AHEAD_H_

#include <array>
#include <cstdint>
#include <optional>

namespace fc {

class ReadAheadStreams {
 public:
  static constexpr int kMaxStreams = 8;

  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
  };

  // `file_size`: reads and advice stop there; `ahead`: how far past a stream's end to keep
  // advised (at least 2 bytes).
  ReadAheadStreams(uint64_t file_size, uint64_t ahead);

  struct Advice {
    std::optional<Range> will_need;  // start reading this now
    std::optional<Range> done;       // read by this stream: droppable
  };

  // A read of `length` bytes at `offset` is about to be issued.
  Advice OnRead(uint64_t offset, uint64_t length);

 private:
  struct Stream {
    uint64_t end = 0;       // where the stream's furthest read ended
    uint64_t advised = 0;   // advice given up to here
    uint64_t done = 0;      // named droppable up to here
    uint64_t last_use = 0;  // for replacement; 0: the slot is free
  };
  uint64_t file_size_;
  uint64_t ahead_;
  uint64_t clock_ = 0;
  std::array<Stream, kMaxStreams> streams_{};
};

}  // namespace fc

#endif  // FC_IO_READ_AHEAD_H_
