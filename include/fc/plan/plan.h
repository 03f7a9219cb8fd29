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
//     is refused with kResourceExhausted naming the minimum) and the expected peak.
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

  friend bool operator==(const WriteItem&, const WriteItem&) = default;
};


struct ProcessPlan {
  std::vector<uint32_t> files;        // target files it writes
  std::vector<uint32_t> writes;       // WriteItem indices, in execution order
  std::vector<SourceFileBytes> reads;  // its files' reads added up, by source file
  uint64_t bytes_read = 0;            // sum of reads
  uint64_t bytes_written = 0;

  friend bool operator==(const ProcessPlan&, const ProcessPlan&) = default;
};

struct PlanMemory {
  uint64_t budget = 0;      // what the run may use for tensor data
  uint64_t minimum = 0;     // the least budget this plan runs in (one thread)
  uint64_t peak = 0;        // expected peak of the executor's buffers
  uint64_t slab_bytes = 0;  // largest write item, in bytes of its widest element type
  uint64_t block_bytes = 0;  // largest whole source block kept for reshaping pieces

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
};

// Builds the plan. Errors: kInvalidArgument for a slot naming a tensor out of range, a box
// outside its tensor or a flat range outside its box; kResourceExhausted when the budget is
// below the plan's minimum ("--memory-budget 1000 is below the 3.1 MiB this plan needs: ...");
// with several threads the thread count is lowered first until the plan fits.
Result<Plan> BuildPlan(PlanRequest request);

// The stored boxes of a slot, in stored order, in tensor coordinates: the box, or its flat
// range decomposed (at most 2*rank-1 boxes).
std::vector<Box> SlotStoredBoxes(const PlanSlot& slot);

// Bytes a slot stores.
uint64_t SlotBytes(const PlanSlot& slot, DType dtype);

// The plan as JSON. `index` names source files and tensors; `details` adds every write item.
std::string PlanJson(const Plan& plan, const CheckpointIndex& index, bool details);

}  // namespace fc

#endif  // FC_PLAN_PLAN_H_
