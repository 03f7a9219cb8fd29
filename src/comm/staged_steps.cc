#include "src/comm/staged_steps.h"

#include <algorithm>

namespace fc {
namespace {

void AddByPeer(std::span<const Communicator::Message> messages, bool send,
               std::vector<PeerStream>& streams) {
  const size_t first = streams.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Communicator::Message& m = messages[i];
    if (m.bytes.empty()) continue;
    auto it = std::find_if(streams.begin() + static_cast<std::ptrdiff_t>(first), streams.end(),
                           [&](const PeerStream& s) { return s.peer == m.peer; });
    if (it == streams.end()) {
      streams.push_back(PeerStream{m.peer, send, {}, {}, 0});
      it = streams.end() - 1;
    }
    it->messages.push_back(i);
    it->sizes.push_back(m.bytes.size());
    it->size += m.bytes.size();
  }
  std::sort(streams.begin() + static_cast<std::ptrdiff_t>(first), streams.end(),
            [](const PeerStream& a, const PeerStream& b) { return a.peer < b.peer; });
}

}  // namespace

std::vector<PeerStream> StreamsByPeer(std::span<const Communicator::Message> sends,
                                      std::span<const Communicator::Message> receives) {
  std::vector<PeerStream> streams;
  AddByPeer(sends, true, streams);
  AddByPeer(receives, false, streams);
  return streams;
}

uint64_t StagingPartSize(uint64_t staging_bytes, int most_streams) {
  if (most_streams <= 0) return 0;
  uint64_t part = staging_bytes / static_cast<uint64_t>(most_streams);
  if (part >= 256) part &= ~uint64_t{255};
  return part;
}

uint64_t StepCount(std::span<const PeerStream> streams, uint64_t part) {
  uint64_t longest = 0;
  for (const PeerStream& s : streams) longest = std::max(longest, s.size);
  return part == 0 ? 0 : (longest + part - 1) / part;
}

std::vector<StagedPart> StepParts(std::span<const PeerStream> streams, uint64_t part,
                                  uint64_t step) {
  std::vector<StagedPart> parts;
  const uint64_t begin = step * part;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].size <= begin) continue;
    parts.push_back(StagedPart{i, begin, std::min(part, streams[i].size - begin),
                               static_cast<uint64_t>(parts.size()) * part});
  }
  return parts;
}

std::vector<MessageRange> PartRanges(const PeerStream& stream, uint64_t begin, uint64_t size) {
  std::vector<MessageRange> ranges;
  const uint64_t end = begin + size;
  uint64_t at = 0;  // offset of message m in the stream
  for (size_t m = 0; m < stream.sizes.size() && at < end; ++m) {
    const uint64_t message_end = at + stream.sizes[m];
    if (message_end > begin && message_end > at) {  // overlaps, and not empty
      const uint64_t from = std::max(begin, at), to = std::min(end, message_end);
      ranges.push_back(MessageRange{m, from - at, to - from, from - begin});
    }
    at = message_end;
  }
  return ranges;
}

}  // namespace fc
