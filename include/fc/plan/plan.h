// Plan: everything a job (fc-export, fc-convert) decides before it moves a tensor byte, as
// plain data. One planner serves every job: a job is a set of target files, each holding
// slots (a whole tensor for an export, a target chunk for a convert), and a set of target
// tensors, each filled from source pieces (fc/plan/piece.h). The planner
//   - shares the target files out between processes by bytes (BalanceByBytes);
//   - cuts every slot into write items: regions of the target tensor that are contiguous in
//     the slot's stored order and small enough for the memory budget;
//   - accounts, per process and source file, the source bytes its write items need (each
//     needed element counted once, through a per-tensor interval index over the source
//     chunks: no scan of every chunk per item);
//   - computes the memory the executor needs: the minimum for this plan (below it the plan
//     is refused with kResourceExhausted naming the minimum) and the expected peak;
//   - with several processes, decides who reads what (fc/plan/exchange.h describes the
//     balancer): every needed source element is read by one process that can see its file,
//     preferably the one writing it; what one process reads for another is a Transfer, sent
//     in rounds whose bytes per process stay within a share of the budget.
// Pure: no IO, no MPI. Deterministic: every process of a run builds the same plan.
//
// The plan refers to the CheckpointIndex its pieces point into (SourcePiece::source); the
// index must outlive it. Plans are movable and comparable (pieces compare by source address,
// so compare plans built on the same index).
//
// JSON (PlanJson; schema in fc-plan(5)): {"format": "fc-plan", "version": 1, "kind",
// "processes", "threads", "memory": {"budget", "minimum", "peak", "slab_bytes"},
// "bytes_needed", "bytes_written", "tensors": [...], "files": [...], "processes_detail":
// [...], and with details the write items}.
#ifndef FC_PLAN_PLAN_H_
#define FC_PLAN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/flat_range.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/plan/piece.h"

namespace fc {

enum class PlanKind { kExport, kConvert };
std::string_view PlanKindName(PlanKind kind);  // "export", "convert"

struct PlanTensor {
  std::string name;
  DType dtype = DType::kFloat32;    // the element type written
  Shape shape;
  std::vector<SourcePiece> pieces;  // dst boxes tile the tensor (checked by the caller)

  friend bool operator==(const PlanTensor&, const PlanTensor&);
};

// One thing a target file stores: a tensor region in row-major order (box), or the flat
// range of a box's row-major flattening (a ZeRO-flattened target chunk).
struct PlanSlot {
  uint32_t tensor = 0;  // PlanTensor index
  Box box;              // target tensor coordinates
  std::optional<FlatRange> flat_range;

  friend bool operator==(const PlanSlot&, const PlanSlot&) = default;
};

struct SourceFileBytes {
  uint32_t file = 0;   // CheckpointIndex::files index
  uint64_t bytes = 0;  // element bytes needed from it

  friend bool operator==(const SourceFileBytes&, const SourceFileBytes&) = default;
};

struct PlanFile {
  std::string name;
  std::vector<PlanSlot> slots;
  int process = 0;     // the process that writes it
  uint64_t bytes = 0;  // tensor bytes its slots hold
  // Source element bytes its write items need, by source file (increasing); a reshaping
  // piece's whole block is counted once per file.
  std::vector<SourceFileBytes> reads;

  friend bool operator==(const PlanFile&, const PlanFile&) = default;
};

// A region of a slot, written with one call: contiguous in the slot's stored order.
struct WriteItem {
  uint32_t file = 0;
  uint32_t slot = 0;         // within the file
  uint32_t tensor = 0;       // the slot's tensor
  Box region;                // target tensor coordinates
  uint64_t byte_offset = 0;  // within the slot's stored bytes
  uint64_t bytes = 0;
  uint32_t round = 0;        // the exchange round in which it is written (0: no exchange)

  friend bool operator==(const WriteItem&, const WriteItem&) = default;
};

// Source elements that one process reads and sends to another, for one of the receiver's
// write items: the elements of `box` (source tensor coordinates) that chunk `chunk` of
// `source` stores, row-major over `box`, in the source dtype. `box` lies inside one of the
// chunk's stored boxes (StoredBoxes), so all of it is stored there.
struct Transfer {
  uint32_t round = 0;
  int reader = 0;         // reads it from its file and sends it
  int writer = 0;         // receives it: the process of the write item's file
  uint32_t write = 0;     // WriteItem index
  const TensorEntry* source = nullptr;
  uint32_t chunk = 0;     // index into source->chunks
  Box box;
  uint64_t bytes = 0;     // box elements x source element size

  friend bool operator==(const Transfer&, const Transfer&) = default;
};


struct ProcessPlan {
  std::vector<uint32_t> files;        // target files it writes
  std::vector<uint32_t> writes;       // WriteItem indices, in execution order
  // Source bytes it reads, by source file: for one process, what its files need; with
  // several, what the balancer gave it (for itself and for others).
  std::vector<SourceFileBytes> reads;
  uint64_t bytes_read = 0;            // sum of reads
  uint64_t bytes_written = 0;
  uint64_t bytes_sent = 0;            // Transfers it reads for others
  uint64_t bytes_received = 0;        // Transfers others read for it

  friend bool operator==(const ProcessPlan&, const ProcessPlan&) = default;
};

struct PlanMemory {
  uint64_t budget = 0;      // what the run may use: --memory-budget
  uint64_t minimum = 0;     // the least budget this plan runs in (one thread), held included
  // The job's own bookkeeping charged to the budget (PlanRequest::held_bytes and the plan's
  // own bytes, less PlanRequest::free_bytes); the tensor buffers get budget - held.
  uint64_t held = 0;
  uint64_t plan_bytes = 0;  // what the plan itself holds (counted, fc/core/heap_bytes.h)
  uint64_t peak = 0;        // expected peak of the executor's buffers
  uint64_t slab_bytes = 0;  // largest write item, in bytes of its widest element type
  uint64_t block_bytes = 0;  // largest whole source block kept for reshaping pieces
  uint64_t round_bytes = 0;  // most bytes a process sends, or receives, in one round
  // The workers' direct IO buffers (PlanRequest::io_buffer_bytes each), part of the peak;
  // 0: the workers read and write through the page cache.
  uint64_t io_buffers = 0;

  friend bool operator==(const PlanMemory&, const PlanMemory&) = default;
};

struct Plan {
  PlanKind kind = PlanKind::kExport;
  int processes = 1;
  int threads = 1;
  PlanMemory memory;
  std::vector<PlanTensor> tensors;
  std::vector<PlanFile> files;
  std::vector<WriteItem> writes;           // by tensor, then file, slot and offset
  // Pieces (tensor, piece index) read whole once and kept while their regions are written:
  // every reshaping piece; transposed pieces and pieces over strided source chunks when the
  // block fits the budget (otherwise they are read per region).
  std::vector<std::pair<uint32_t, uint32_t>> whole_blocks;
  std::vector<ProcessPlan> per_process;    // size == processes
  uint64_t bytes_needed = 0;               // source element bytes, each needed element once
  uint64_t bytes_written = 0;              // target tensor bytes
  // Sorted by (round, reader, writer, write item, chunk): the order both sides pack and
  // unpack a round's message between two processes.
  std::vector<Transfer> transfers;
  uint32_t rounds = 0;               // exchange rounds (0: nothing moves between processes)
  uint32_t rounds_lower_bound = 0;   // no schedule within round_bytes needs fewer
  double read_balance = 1.0;         // max / mean of per-process bytes_read

  friend bool operator==(const Plan&, const Plan&) = default;
};

struct PlanRequest {
  PlanKind kind = PlanKind::kExport;
  std::vector<PlanTensor> tensors;
  struct File {
    std::string name;
    std::vector<PlanSlot> slots;
  };
  std::vector<File> files;
  int processes = 1;
  int threads = 1;              // worker threads per process (>= 1)
  uint64_t memory_budget = 0;   // bytes for tensor buffers per process (> 0)
  // Which processes can read each source file (CheckpointIndex::files index -> increasing
  // ranks). Empty: every process sees every file. With more than one process, a quarter of
  // the budget bounds what a process sends in a round, a quarter what it receives, and the
  // workers get the other half.
  std::vector<std::vector<int>> source_visibility;
  // Whether the run verifies chunk checksums: then every needed part of a checksummed chunk
  // is read by one process (fc/plan/exchange.h), which hashes the chunk in one pass.
  bool verify_checksums = true;
  // The job's bookkeeping, charged to memory_budget so that the budget bounds the process
  // (issue 15 item 4: peak RSS <= budget + 64 MiB): what the process holds besides the plan
  // (the open checkpoint index, measured by the caller), to which the planner adds what the
  // plan itself holds (counted). The first free_bytes of the sum are not charged (the part
  // of the 64 MiB allowance the bookkeeping may use); the rest is taken from the budget
  // before the tensor buffers are sized and is part of the minimum.
  // Only with charge_held; without it the budget is for the tensor buffers alone.
  bool charge_held = false;
  uint64_t held_bytes = 0;
  uint64_t free_bytes = 0;
  // The least budget the job's peak so far fits in (0: none); part of the minimum.
  uint64_t peak_floor = 0;
  // Bytes each worker thread holds to read and write with direct IO besides the plan's
  // buffers (its bounce buffer: DirectIoBufferBytes() in fc/io/env.h). Taken from the budget
  // per thread before the tensor buffers are sized when the budget affords them (what is
  // left still gives every worker full-size slabs): then PlanMemory::io_buffers is non-zero and
  // the workers may use direct IO; otherwise it is 0 and they must not (the executor turns
  // it off on their threads). Never part of the minimum.
  uint64_t io_buffer_bytes = 0;
};

// Builds the plan. Errors: kInvalidArgument for a slot naming a tensor out of range, a box
// outside its tensor or a flat range outside its box; kResourceExhausted when the budget is
// below the plan's minimum ("--memory-budget 1000 is below the 3.1 MiB this plan needs: ...",
// bookkeeping included: PlanRequest::held_bytes);
// with several threads the thread count is lowered first until the plan fits; kNotFound
// naming the source file when a needed file is visible to no process.
Result<Plan> BuildPlan(PlanRequest request);

// The stored boxes of a slot, in stored order, in tensor coordinates: the box, or its flat
// range decomposed (at most 2*rank-1 boxes).
std::vector<Box> SlotStoredBoxes(const PlanSlot& slot);

// Bytes a slot stores.
uint64_t SlotBytes(const PlanSlot& slot, DType dtype);

// What the plan holds on the heap, counted (fc/core/heap_bytes.h), its own struct included.
uint64_t PlanHeldBytes(const Plan& plan);

// Bytes each of the two reorder pools may keep: the reader's parts of checksummed source
// chunks read ahead of the bytes before them (ChunkReader::SetReorderLimit) and the fc
// distcp writer's slabs written ahead of theirs (FcDistcpWriterOptions::reorder_limit).
// They get what the budget leaves beyond the bookkeeping and the executor's buffers
// (memory.held + memory.peak), half each, at most an eighth of the budget each; 0 when
// nothing is left (such bytes are then read, or hashed, from the file again).
uint64_t ReorderAllowance(const PlanMemory& memory);

// The plan as JSON. `index` names source files and tensors; `details` adds every write item.
std::string PlanJson(const Plan& plan, const CheckpointIndex& index, bool details);

}  // namespace fc

#endif  // FC_PLAN_PLAN_H_
