// The NCCL transport's schedule (private to comm/): how one Exchange round goes through a
// device staging buffer of fixed size, in steps. Pure, so that it is tested without a GPU
// (tests/comm/staged_steps_test.cc moves bytes by this schedule with memcpy).
//
// All of a process's messages to one peer form one byte stream, and so do those from one
// peer (both sides of a pair see the same sizes in the same order). Every process cuts
// every stream into parts of the same size (StagingPartSize of the most streams any process
// has in the round), and step k carries part k of every stream that long. So both sides of
// a pair post the same part in the same step: step k on a process waits only for step k on
// its peers, which wait only for step k - 1 to end. Groups that differ between the two
// sides of a pair could deadlock. A step's parts sit in disjoint slots of the buffer.
#ifndef FC_SRC_COMM_STAGED_STEPS_H_
#define FC_SRC_COMM_STAGED_STEPS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "fc/comm/communicator.h"

namespace fc {

// One peer's messages in one direction, in order; empty messages left out (the peer's
// matching message is empty too).
struct PeerStream {
  int peer = 0;
  bool send = false;
  std::vector<size_t> messages;  // indexes into the sends (or receives) given
  std::vector<uint64_t> sizes;   // their sizes
  uint64_t size = 0;             // their sum
};

// The send streams (by peer, ascending), then the receive streams (by peer, ascending).
std::vector<PeerStream> StreamsByPeer(std::span<const Communicator::Message> sends,
                                      std::span<const Communicator::Message> receives);

// The part size for a buffer of `staging_bytes` when some process has `most_streams`
// streams: most_streams parts fit; a multiple of 256 (aligned slots) when that is >= 256.
// 0 when most_streams <= 0, or when the buffer cannot hold one byte per stream.
uint64_t StagingPartSize(uint64_t staging_bytes, int most_streams);

// Bytes [begin, begin + size) of stream `stream` (an index into the list given), staged at
// byte `slot` of the buffer.
struct StagedPart {
  size_t stream = 0;
  uint64_t begin = 0;
  uint64_t size = 0;
  uint64_t slot = 0;
};

// How many steps this process takes: ceil(longest stream / part); 0 when it has none.
uint64_t StepCount(std::span<const PeerStream> streams, uint64_t part);

// Step `step`'s parts, in stream order: part `step` of every stream longer than step * part,
// in slots 0, part, 2 * part, ...
std::vector<StagedPart> StepParts(std::span<const PeerStream> streams, uint64_t part,
                                  uint64_t step);

// A piece of one message that lies in a part: bytes [offset, offset + size) of message
// `message` (an index into the stream's messages) are bytes [at, at + size) of the part.
struct MessageRange {
  size_t message = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t at = 0;
};

// The message ranges that make up bytes [begin, begin + size) of `stream`, in order.
std::vector<MessageRange> PartRanges(const PeerStream& stream, uint64_t begin, uint64_t size);

}  // namespace fc

#endif  // FC_SRC_COMM_STAGED_STEPS_H_
