// The balancer and the exchange schedule of a multi-process plan. Private to plan/; the
// result is Plan::transfers, rounds and the per-process figures (fc/plan/plan.h).
//
// Needs. Every write item needs, from each source piece overlapping it, the elements of a
// source box (the piece's whole block when the executor reads it whole); a need is that box
// cut by the stored boxes of the source chunks, so one need lies in one file. A whole block
// is one set of needs per writing process, shared by its items.
//
// Readers (deterministic, in the writers' execution order) are chosen per unit: one need, or
// with `chunk_affinity` (checksums verified) all needs of one chunk that carries a checksum,
// so that one process reads every part of the chunk the job needs and its hash runs over
// those reads alone (no process rereads parts others read to verify the chunk):
//   1. the writer reads a unit itself when it can see the file (nothing moves); for a chunk's
//      unit, the writer of most of its bytes among those that see the file (ties: lowest rank);
//   2. otherwise the least loaded process that can see the file (ties: lowest rank);
//   3. then, while a process reads more than 1.10 x the mean, its units move to processes
//      that see their files and stay under that mark (so max/mean <= 1.15 wherever the
//      visibility and the size of the units allow).
//
// Rounds. Each writer's items stay in its execution order; round by round, every writer (in
// turn, starting with a different one each round) takes its next items while what it
// receives, and what each of their readers sends, stays within `round_bytes` (raised to the
// largest single item's, so every item fits a round of its own). A whole block sent in an
// earlier round is sent again when a later round needs it (the receiver keeps a round's data
// for that round only). All pairs of a round move at once. Lower bound: the most bytes a
// process sends or receives over the whole plan, divided by round_bytes, rounded up.
#ifndef FC_PLAN_EXCHANGE_H_
#define FC_PLAN_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "fc/core/status.h"
#include "fc/plan/plan.h"
#include "src/plan/source_index.h"

namespace fc {

// Fills plan.transfers, rounds, rounds_lower_bound, read_balance, memory.round_bytes, the
// writes' rounds and per_process reads/bytes_read/bytes_sent/bytes_received. `visibility`
// as PlanRequest::source_visibility; `chunk_affinity` as PlanRequest::verify_checksums.
// Errors: kNotFound for a needed file no process sees.
Status PlanExchange(Plan& plan, const std::vector<std::vector<int>>& visibility,
                    uint64_t round_budget, bool chunk_affinity, SourceIndexes& indexes);

}  // namespace fc

#endif  // FC_PLAN_EXCHANGE_H_
