// Why fc advises read-ahead itself: a convert reads each source file as several sequential
// runs at once (a ZeRO partition's fp32 master weights and its two Adam moments are three
// runs through one file, visited parameter by parameter, each in 2 MiB slabs). The kernel's
// read-ahead keeps one window per open file and restarts it small after a read elsewhere;
// told which bytes a stream needs next (POSIX_FADV_WILLNEED), the kernel reads them while the
// worker assembles and writes the slab before.
#include "fc/io/read_ahead.h"

#include <algorithm>

namespace fc {

ReadAheadStreams::ReadAheadStreams(uint64_t file_size, uint64_t ahead)
    : file_size_(file_size), ahead_(std::max<uint64_t>(ahead, 2)) {}

ReadAheadStreams::Advice ReadAheadStreams::OnRead(uint64_t offset, uint64_t length) {
  ++clock_;
  const uint64_t end =
      offset >= file_size_ ? file_size_ : offset + std::min(length, file_size_ - offset);
  Stream* stream = nullptr;
  for (Stream& s : streams_) {
    // offset in [s.end - ahead, s.end + ahead], written without wrapping.
    if (s.last_use != 0 && offset + std::min(s.end, ahead_) >= s.end &&
        offset <= s.end + ahead_) {
      if (stream == nullptr || s.last_use > stream->last_use) stream = &s;
    }
  }
  Advice advice;
  if (stream == nullptr) {
    Stream* oldest = &streams_[0];
    for (Stream& s : streams_) {
      if (s.last_use < oldest->last_use) oldest = &s;
    }
    *oldest = Stream{end, end, std::min(offset, end), clock_};
    return advice;
  }
  stream->last_use = clock_;
  stream->end = std::max(stream->end, end);
  const uint64_t want = std::min(file_size_, stream->end + ahead_);
  const uint64_t from = std::max(stream->advised, stream->end);
  if (want > from && (want - from >= ahead_ / 2 || want == file_size_)) {
    stream->advised = want;
    advice.will_need = Range{from, want - from};
  }
  // Never the read about to be issued (the advice comes before it); at the end of the file
  // the stream is over, and all it read before this read may go.
  const bool over = stream->end == file_size_;
  const uint64_t settled =
      std::min(offset, over ? stream->end : stream->end - std::min(stream->end, ahead_ / 4));
  if (settled > stream->done && (settled - stream->done >= ahead_ / 2 || over)) {
    advice.done = Range{stream->done, settled - stream->done};
    stream->done = settled;
  }
  return advice;
}

}  // namespace fc
