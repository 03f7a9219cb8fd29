#include "fc/plan/plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "fc/codec/json_writer.h"
#include "fc/core/checked_math.h"
#include "fc/core/heap_bytes.h"
#include "fc/core/human_bytes.h"
#include "fc/plan/slabs.h"
#include "src/plan/exchange.h"
#include "src/plan/source_index.h"

namespace fc {
namespace {

// The smallest write item the planner cuts, in bytes of the widest element type involved
// (tiny budgets work, slowly: each item costs a few system calls).
constexpr uint64_t kMinSlabBytes = 64;

size_t WidestElement(const PlanTensor& t) {
  size_t widest = DTypeSize(t.dtype);
  for (const SourcePiece& p : t.pieces) {
    if (p.source) widest = std::max(widest, DTypeSize(p.source->dtype));
    for (const PieceOp& op : p.ops) {
      if (op.kind == PieceOp::Kind::kCast) widest = std::max(widest, DTypeSize(op.dtype));
    }
  }
  return widest;
}

// Bytes the executor keeps for one piece read whole: the source block, the block after its
// ops, and one scratch copy, each at most `widest` bytes per element.
uint64_t ReshapeBlockBytes(const SourcePiece& p, size_t widest) {
  return static_cast<uint64_t>(p.src_box.num_elements()) * 3 * widest;
}

bool HasStridedChunks(const TensorEntry& t) {
  return std::any_of(t.chunks.begin(), t.chunks.end(),
                     [](const Chunk& c) { return !c.strides.empty(); });
}

// Target files to processes. Without visibility: balanced by bytes (BalanceByBytes). With
// it, largest file first, to the process that can read most of the file's source bytes
// itself among those that stay within 1.10 x the mean bytes written (ties: least loaded,
// then lowest rank), so that little moves between processes; process 0 always gets a file
// (it commits the output).
std::vector<std::vector<size_t>> AssignFiles(
    const std::vector<uint64_t>& file_bytes,
    const std::vector<std::map<uint32_t, uint64_t>>& file_reads,
    const std::vector<std::vector<int>>& visibility, int processes) {
  if (visibility.empty() || processes < 2) return BalanceByBytes(file_bytes, processes);
  const auto P = static_cast<size_t>(processes);
  uint64_t total = 0, largest = 0;
  for (uint64_t b : file_bytes) {
    total += b;
    largest = std::max(largest, b);
  }
  const double limit = std::max(1.10 * static_cast<double>(total) / static_cast<double>(P),
                                static_cast<double>(largest));
  std::vector<size_t> order(file_bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return file_bytes[a] > file_bytes[b]; });
  std::vector<std::vector<size_t>> assignment(P);
  std::vector<uint64_t> load(P, 0);
  std::map<int, uint64_t> local;
  for (size_t f : order) {
    local.clear();
    for (const auto& [source, bytes] : file_reads[f]) {
      if (source >= visibility.size()) continue;
      for (int q : visibility[source]) local[q] += bytes;
    }
    int best = -1;
    auto better = [&](int q, int than) {
      if (than < 0) return true;
      const uint64_t lq = local.count(q) ? local[q] : 0, lt = local.count(than) ? local[than] : 0;
      if (lq != lt) return lq > lt;
      return load[static_cast<size_t>(q)] < load[static_cast<size_t>(than)];
    };
    for (int q = 0; q < processes; ++q) {
      if (static_cast<double>(load[static_cast<size_t>(q)] + file_bytes[f]) > limit) continue;
      if (better(q, best)) best = q;
    }
    if (best < 0) {  // nobody under the limit: the least loaded
      best = 0;
      for (int q = 1; q < processes; ++q) {
        if (load[static_cast<size_t>(q)] < load[static_cast<size_t>(best)]) best = q;
      }
    }
    assignment[static_cast<size_t>(best)].push_back(f);
    load[static_cast<size_t>(best)] += file_bytes[f];
  }
  if (assignment[0].empty() && !file_bytes.empty()) {
    // Process 0 commits: it takes the smallest file of the process with the most files.
    size_t from = 0;
    for (size_t q = 1; q < P; ++q) {
      if (assignment[q].size() > assignment[from].size()) from = q;
    }
    assignment[0].push_back(assignment[from].back());
    assignment[from].pop_back();
  }
  for (std::vector<size_t>& files : assignment) std::sort(files.begin(), files.end());
  return assignment;
}

Status ValidateRequest(const PlanRequest& r) {
  if (r.threads < 1) return InvalidArgumentError("threads must be at least 1");
  if (r.processes < 1) return InvalidArgumentError("processes must be at least 1");
  for (const std::vector<int>& seen_by : r.source_visibility) {
    for (size_t i = 0; i < seen_by.size(); ++i) {
      if (seen_by[i] < 0 || seen_by[i] >= r.processes || (i > 0 && seen_by[i] <= seen_by[i - 1])) {
        return InvalidArgumentError("source visibility lists process " +
                                    std::to_string(seen_by[i]) + " of " +
                                    std::to_string(r.processes) + " out of order or range");
      }
    }
  }
  for (const PlanRequest::File& f : r.files) {
    for (const PlanSlot& s : f.slots) {
      if (s.tensor >= r.tensors.size()) {
        return InvalidArgumentError(f.name + ": slot names tensor " + std::to_string(s.tensor) +
                                    " of " + std::to_string(r.tensors.size()));
      }
      const PlanTensor& t = r.tensors[s.tensor];
      if (Status box = ValidateBox(s.box, t.shape); !box.ok()) {
        return InvalidArgumentError(f.name + ": tensor '" + t.name + "': " + box.message());
      }
      if (s.flat_range && (s.flat_range->inclusive_min < 0 ||
                           s.flat_range->exclusive_max < s.flat_range->inclusive_min ||
                           s.flat_range->exclusive_max > s.box.num_elements())) {
        return InvalidArgumentError(f.name + ": tensor '" + t.name + "' box " +
                                    s.box.ToString() + ": flat range " +
                                    s.flat_range->ToString() + " is outside the box");
      }
    }
  }
  return Status::Ok();
}

// The pieces whose source blocks the executor reads whole: reshaping pieces always (added to
// plan.whole_blocks here), transposed and strided ones when they fit (`optional_blocks`,
// decided once the budget is known); `block_bytes`, the largest block always read whole;
// `widest`, WidestElement per tensor.
struct WholeBlocks {
  std::vector<size_t> widest;
  uint64_t block_bytes = 0;
  std::vector<std::pair<uint32_t, uint32_t>> optional_blocks;
};

WholeBlocks ChooseWholeBlocks(Plan& plan) {
  WholeBlocks blocks;
  std::vector<size_t>& widest = blocks.widest;
  uint64_t& block_bytes = blocks.block_bytes;
  std::vector<std::pair<uint32_t, uint32_t>>& optional_blocks = blocks.optional_blocks;
  widest.resize(plan.tensors.size());
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    widest[t] = WidestElement(plan.tensors[t]);
    for (size_t k = 0; k < plan.tensors[t].pieces.size(); ++k) {
      const SourcePiece& p = plan.tensors[t].pieces[k];
      if (!p.source) continue;
      if (PieceReshapes(p)) {
        block_bytes = std::max(block_bytes, ReshapeBlockBytes(p, widest[t]));
        plan.whole_blocks.emplace_back(t, k);
      } else if (PieceTransposes(p) || HasStridedChunks(*p.source)) {
        optional_blocks.emplace_back(t, k);
      }
    }
  }
  return blocks;
}

// The plan's bytes estimated from what the request holds (the write items are at least one
// per stored box), before the plan is cut.
uint64_t EstimatePlanBytes(const PlanRequest& request) {
  uint64_t plan_estimate = sizeof(Plan) + HeapBytes(request.tensors) + HeapBytes(request.files);
  for (const PlanTensor& t : request.tensors) {
    plan_estimate += HeapBytes(t.name) + HeapBytes(t.shape) + HeapBytes(t.pieces);
    for (const SourcePiece& p : t.pieces) {
      plan_estimate += HeapBytes(p.src_box) + HeapBytes(p.dst_box) + HeapBytes(p.ops);
    }
  }
  for (const PlanRequest::File& f : request.files) {
    plan_estimate += HeapBytes(f.name) + HeapBytes(f.slots);
    for (const PlanSlot& slot : f.slots) {
      // The slot's box, and at least one write item (its region, its index per process).
      plan_estimate +=
          2 * HeapBytes(slot.box) + sizeof(WriteItem) + sizeof(uint32_t);
    }
  }
  return plan_estimate;
}

// The memory budget's rules for one request: what the job's bookkeeping takes off the
// budget, the least budget a plan needs, and the error for a budget below it. They depend on
// `block_bytes`, the whole blocks' reservation per worker, read at each call: it grows as
// optional blocks are taken, and must outlive the rules.
class BudgetRules {
 public:
  BudgetRules(const PlanRequest& request, const uint64_t& block_bytes)
      : request_(request), block_bytes_(block_bytes) {}

  // Several processes: half of the data budget for the workers, a quarter each for what a
  // process sends and receives in an exchange round.
  uint64_t share() const { return request_.processes > 1 ? 2 : 1; }

  // The bytes of the job's bookkeeping (the index held, and `plan_bytes` of plan) charged
  // to the budget: what is beyond the free allowance, when the request charges them.
  uint64_t ChargedFor(uint64_t plan_bytes) const {
    if (!request_.charge_held) return 0;
    const uint64_t held = request_.held_bytes + plan_bytes;
    return held > request_.free_bytes ? held - request_.free_bytes : 0;
  }

  // The data budget `threads` workers need at the least.
  uint64_t DataMinimumFor(int threads) const {
    return static_cast<uint64_t>(threads) * (3 * kMinSlabBytes + block_bytes_) * share();
  }

  // The direct IO buffers of `threads` workers (PlanRequest::io_buffer_bytes each) when
  // `unheld` bytes of budget (what the bookkeeping leaves) afford them without shrinking the
  // workers' buffers: what is left still holds full-size slabs (kMaxSlabBytes) and the
  // blocks for every worker. Else 0, and the workers read and write through the page cache
  // (with 4 workers, under about 40 MiB of budget).
  uint64_t IoBuffersFor(int threads, uint64_t unheld) const {
    const uint64_t io = static_cast<uint64_t>(threads) * request_.io_buffer_bytes;
    const uint64_t full =
        static_cast<uint64_t>(threads) * (3 * kMaxSlabBytes + block_bytes_) * share();
    if (io == 0 || unheld < io || unheld - io < full) return 0;
    return io;
  }

  // The least budget of a plan whose bookkeeping charges `charged`.
  uint64_t MinimumWith(uint64_t charged) const {
    const uint64_t floor = request_.charge_held ? request_.peak_floor : 0;
    return std::max(floor, charged + DataMinimumFor(1));
  }

  // kResourceExhausted: the budget is below MinimumWith(charged), and why.
  Status BelowMinimum(uint64_t charged, uint64_t plan_bytes) const {
    const uint64_t minimum = MinimumWith(charged);
    std::string why = "3 staging buffers of " + HumanBytes(kMinSlabBytes);
    if (block_bytes_ > 0) why += " and a reshaped source block of " + HumanBytes(block_bytes_);
    if (share() > 1) {
      why += ", twice over: half of the budget is for the exchange between processes";
    }
    if (charged > 0) {
      why += "; and the job's bookkeeping: " + HumanBytes(charged) +
             " (the checkpoint index and the plan, " + HumanBytes(plan_bytes) +
             " of it the plan, beyond the first " + HumanBytes(request_.free_bytes) + ")";
    }
    if (request_.charge_held && request_.peak_floor > charged + DataMinimumFor(1)) {
      why += "; reading the checkpoint's metadata already took " +
             HumanBytes(request_.peak_floor) + " more than that allowance";
    }
    return ResourceExhaustedError("--memory-budget " + std::to_string(request_.memory_budget) +
                                  " is below the " + std::to_string(minimum) + " bytes (" +
                                  HumanBytes(minimum) + ") this plan needs (" + why + ")");
  }

 private:
  const PlanRequest& request_;
  const uint64_t& block_bytes_;
};

// Target files, moved from the request into the plan with their bytes counted (they are
// shared out between processes once their source reads are known). Returns their bytes.
std::vector<uint64_t> AddTargetFiles(Plan& plan, std::vector<PlanRequest::File>& files) {
  std::vector<uint64_t> file_bytes;
  for (PlanRequest::File& f : files) {
    PlanFile pf;
    pf.name = std::move(f.name);
    pf.slots = std::move(f.slots);
    for (const PlanSlot& s : pf.slots) pf.bytes += SlotBytes(s, plan.tensors[s.tensor].dtype);
    plan.bytes_written += pf.bytes;
    file_bytes.push_back(pf.bytes);
    plan.files.push_back(std::move(pf));
  }
  return file_bytes;
}

// Write items: every slot cut into slabs contiguous in its stored order, of at most
// `slab_limit` bytes of the widest element type involved (`widest`, per tensor). Returns the
// largest item's bytes in that type.
uint64_t CutWriteItems(Plan& plan, const std::vector<size_t>& widest, uint64_t slab_limit) {
  uint64_t largest_item = 0;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const PlanFile& file = plan.files[f];
    for (size_t s = 0; s < file.slots.size(); ++s) {
      const PlanSlot& slot = file.slots[s];
      const PlanTensor& tensor = plan.tensors[slot.tensor];
      const size_t esize = DTypeSize(tensor.dtype);
      const int64_t max_elements =
          std::max<int64_t>(1, static_cast<int64_t>(slab_limit / widest[slot.tensor]));
      if (!slot.flat_range &&
          (slot.box.rank() == 0 || slot.box.num_elements() <= max_elements)) {
        // One write item for the whole slot (a small chunk: most of them, at scale). No
        // slab lists, no copies but the region's.
        WriteItem item;
        item.file = static_cast<uint32_t>(f);
        item.slot = static_cast<uint32_t>(s);
        item.tensor = slot.tensor;
        item.bytes = static_cast<uint64_t>(slot.box.num_elements()) * esize;
        largest_item = std::max(largest_item, static_cast<uint64_t>(slot.box.num_elements()) *
                                                  widest[slot.tensor]);
        item.region = slot.box;
        plan.writes.push_back(std::move(item));
        continue;
      }
      uint64_t element_offset = 0;
      for (const Box& stored : SlotStoredBoxes(slot)) {
        for (Box& region : ContiguousSlabs(stored, max_elements)) {
          int64_t first = 0;
          if (region.rank() > 0) {
            Shape rel(region.rank());
            for (size_t i = 0; i < region.rank(); ++i) {
              rel[i] = region.global_offset[i] - stored.global_offset[i];
            }
            first = Ravel(rel, stored.local_shape);
          }
          WriteItem item;
          item.file = static_cast<uint32_t>(f);
          item.slot = static_cast<uint32_t>(s);
          item.tensor = slot.tensor;
          item.bytes = static_cast<uint64_t>(region.num_elements()) * esize;
          item.byte_offset = (element_offset + static_cast<uint64_t>(first)) * esize;
          largest_item = std::max(largest_item, static_cast<uint64_t>(region.num_elements()) *
                                                    widest[slot.tensor]);
          item.region = std::move(region);
          plan.writes.push_back(std::move(item));
        }
        element_offset += static_cast<uint64_t>(stored.num_elements());
      }
    }
  }
  return largest_item;
}

// Grouped by tensor, so that a reshaped source block serves all its target regions while
// it is held; within a tensor, in file and stored order (checksums stream in order).
// A stable counting sort: items are moved once, not compared.
void GroupWritesByTensor(Plan& plan) {
  std::vector<size_t> start(plan.tensors.size() + 1, 0);
  for (const WriteItem& w : plan.writes) ++start[w.tensor + 1];
  for (size_t t = 0; t < plan.tensors.size(); ++t) start[t + 1] += start[t];
  std::vector<WriteItem> sorted(plan.writes.size());
  for (WriteItem& w : plan.writes) sorted[start[w.tensor]++] = std::move(w);
  plan.writes = std::move(sorted);
}

// Source bytes per target file: every item's pieces, through the interval index; a
// reshaping piece's whole block counted once per file. A process reads what its files need.
std::vector<std::map<uint32_t, uint64_t>> SourceReadsPerFile(const Plan& plan,
                                                             SourceIndexes& indexes) {
  std::vector<std::map<uint32_t, uint64_t>> file_reads(plan.files.size());
  std::set<std::tuple<uint32_t, uint32_t, size_t>> whole_blocks;  // (file, tensor, piece)
  for (const WriteItem& item : plan.writes) {
    ForEachItemSource(plan, item, [&](uint32_t k, const SourcePiece& piece, bool whole,
                                      const Box& src) {
      if (whole && !whole_blocks.insert({item.file, item.tensor, k}).second) return;
      const uint64_t esize = DTypeSize(piece.source->dtype);
      std::map<uint32_t, uint64_t>& into = file_reads[item.file];
      indexes.Of(piece.source).ForEachCount(src, [&](int64_t n, uint32_t file, uint32_t) {
        into[file] += static_cast<uint64_t>(n) * esize;
      });
    });
  }
  return file_reads;
}

// Files to processes as `assignment` lists them, each process's write items (in the plan's
// order) and its source reads: what its files need (`file_reads`, per target file).
void AssignProcesses(Plan& plan, const std::vector<std::vector<size_t>>& assignment,
                     const std::vector<std::map<uint32_t, uint64_t>>& file_reads) {
  plan.per_process.resize(static_cast<size_t>(plan.processes));
  for (size_t p = 0; p < assignment.size(); ++p) {
    for (size_t f : assignment[p]) {
      plan.files[f].process = static_cast<int>(p);
      plan.per_process[p].files.push_back(static_cast<uint32_t>(f));
      plan.per_process[p].bytes_written += plan.files[f].bytes;
    }
  }
  for (size_t w = 0; w < plan.writes.size(); ++w) {
    const int p = plan.files[plan.writes[w].file].process;
    plan.per_process[static_cast<size_t>(p)].writes.push_back(static_cast<uint32_t>(w));
  }
  for (ProcessPlan& pp : plan.per_process) {
    std::map<uint32_t, uint64_t> reads;
    for (uint32_t f : pp.files) {
      for (const auto& [file, bytes] : file_reads[f]) {
        plan.files[f].reads.push_back({file, bytes});
        reads[file] += bytes;
      }
    }
    for (const auto& [file, bytes] : reads) {
      pp.reads.push_back({file, bytes});
      pp.bytes_read += bytes;
    }
    plan.bytes_needed += pp.bytes_read;
  }
}

}  // namespace

std::string_view PlanKindName(PlanKind kind) {
  return kind == PlanKind::kExport ? "export" : "convert";
}

bool operator==(const PlanTensor& a, const PlanTensor& b) {
  if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape ||
      a.pieces.size() != b.pieces.size()) {
    return false;
  }
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    const SourcePiece& x = a.pieces[i];
    const SourcePiece& y = b.pieces[i];
    if (x.source != y.source || x.src_box != y.src_box || x.dst_box != y.dst_box ||
        x.ops != y.ops || x.fill_value != y.fill_value) {
      return false;
    }
  }
  return true;
}

std::vector<Box> SlotStoredBoxes(const PlanSlot& slot) {
  return StoredBoxes(slot.box, slot.flat_range);
}

uint64_t SlotBytes(const PlanSlot& slot, DType dtype) {
  const int64_t n = slot.flat_range ? slot.flat_range->size() : slot.box.num_elements();
  return static_cast<uint64_t>(n) * DTypeSize(dtype);
}

Result<Plan> BuildPlan(PlanRequest request) {
  FC_RETURN_IF_ERROR(ValidateRequest(request));
  Plan plan;
  plan.kind = request.kind;
  plan.processes = request.processes;
  plan.tensors = std::move(request.tensors);

  // Memory: per worker a write buffer and two staging copies of a source block (read, then
  // permuted or converted), plus the whole source blocks of reshaping pieces, which are kept
  // while their target regions are written so that each is read once.
  WholeBlocks blocks = ChooseWholeBlocks(plan);
  const std::vector<size_t>& widest = blocks.widest;
  uint64_t& block_bytes = blocks.block_bytes;
  // The job's bookkeeping comes off the budget first: what the process holds besides the
  // plan (the index), and the plan itself, estimated here from what the request holds (the
  // write items are at least one per stored box) and counted exactly once cut (below).
  const uint64_t plan_estimate = EstimatePlanBytes(request);
  const BudgetRules rules(request, block_bytes);
  const uint64_t held = rules.ChargedFor(plan_estimate);
  const uint64_t unheld = request.memory_budget > held ? request.memory_budget - held : 0;
  int threads = request.threads;
  while (threads > 1 && unheld < rules.DataMinimumFor(threads)) --threads;
  if (request.memory_budget < rules.MinimumWith(held)) {
    return rules.BelowMinimum(held, plan_estimate);
  }
  plan.threads = threads;
  // The workers' direct IO buffers come off next, when the budget affords them; the rest is
  // for the tensor buffers (and, with several processes, the exchange).
  const uint64_t io_buffers = rules.IoBuffersFor(threads, unheld);
  const uint64_t data_budget = unheld - io_buffers;
  const uint64_t budget = data_budget / rules.share();
  // Transposed and strided pieces are read whole when the block fits in half of a worker's
  // share (or in the reservation reshapes already need); otherwise per region.
  const uint64_t optional_limit =
      std::max(block_bytes, budget / static_cast<uint64_t>(threads) / 2);
  for (const auto& [t, k] : blocks.optional_blocks) {
    const uint64_t b = ReshapeBlockBytes(plan.tensors[t].pieces[k], widest[t]);
    if (b > optional_limit) continue;
    block_bytes = std::max(block_bytes, b);
    plan.whole_blocks.emplace_back(t, k);
  }
  std::sort(plan.whole_blocks.begin(), plan.whole_blocks.end());
  const uint64_t per_worker = budget / static_cast<uint64_t>(threads) - block_bytes;
  const uint64_t slab_limit = std::min<uint64_t>(kMaxSlabBytes, per_worker / 3);

  const std::vector<uint64_t> file_bytes = AddTargetFiles(plan, request.files);
  const uint64_t largest_item = CutWriteItems(plan, widest, slab_limit);
  GroupWritesByTensor(plan);
  plan.memory.budget = request.memory_budget;
  plan.memory.minimum = rules.MinimumWith(held);
  plan.memory.held = held;
  plan.memory.plan_bytes = plan_estimate;
  plan.memory.slab_bytes = largest_item;
  plan.memory.block_bytes = block_bytes;
  const size_t busy = std::min<size_t>(static_cast<size_t>(threads),
                                       std::max<size_t>(plan.writes.size(), 1));
  plan.memory.io_buffers =
      io_buffers > 0 ? static_cast<uint64_t>(busy) * request.io_buffer_bytes : 0;
  plan.memory.peak =
      static_cast<uint64_t>(busy) * (3 * largest_item + block_bytes) + plan.memory.io_buffers;

  SourceIndexes indexes;
  const std::vector<std::map<uint32_t, uint64_t>> file_reads = SourceReadsPerFile(plan, indexes);
  // Files to processes: balanced by bytes; with visibility, each to a process that sees
  // most of what it reads (AssignFiles).
  const std::vector<std::vector<size_t>> assignment =
      AssignFiles(file_bytes, file_reads, request.source_visibility, plan.processes);
  AssignProcesses(plan, assignment, file_reads);
  if (plan.processes > 1) {
    FC_RETURN_IF_ERROR(PlanExchange(plan, request.source_visibility, data_budget / 4,
                                    request.verify_checksums, indexes));
    // The exchange buffers: what a process sends and receives in one round.
    plan.memory.peak += 2 * plan.memory.round_bytes;
  }
  // The plan as cut, counted: more write items than estimated (slabs of big slots) hold
  // more; the minimum says so, and a budget below it is refused.
  plan.memory.plan_bytes = PlanHeldBytes(plan);
  if (plan.memory.plan_bytes > plan_estimate) {
    const uint64_t charged = rules.ChargedFor(plan.memory.plan_bytes);
    plan.memory.held = charged;
    plan.memory.minimum = rules.MinimumWith(charged);
    if (request.memory_budget < plan.memory.minimum) {
      return rules.BelowMinimum(charged, plan.memory.plan_bytes);
    }
  }
  return plan;
}

uint64_t ReorderAllowance(const PlanMemory& memory) {
  const uint64_t used = memory.held + memory.peak;
  if (used < memory.held || memory.budget <= used) return 0;  // (the sum wrapped) or none left
  return std::min(memory.budget / 8, (memory.budget - used) / 2);
}

uint64_t PlanHeldBytes(const Plan& plan) {
  uint64_t n = sizeof(Plan) + HeapBytes(plan.tensors) + HeapBytes(plan.files) +
               HeapBytes(plan.writes) + HeapBytes(plan.whole_blocks) +
               HeapBytes(plan.per_process) + HeapBytes(plan.transfers);
  for (const PlanTensor& t : plan.tensors) {
    n += HeapBytes(t.name) + HeapBytes(t.shape) + HeapBytes(t.pieces);
    for (const SourcePiece& p : t.pieces) {
      n += HeapBytes(p.src_box) + HeapBytes(p.dst_box) + HeapBytes(p.ops);
      for (const PieceOp& op : p.ops) n += HeapBytes(op.permutation) + HeapBytes(op.shape);
    }
  }
  for (const PlanFile& f : plan.files) {
    n += HeapBytes(f.name) + HeapBytes(f.slots) + HeapBytes(f.reads);
    for (const PlanSlot& s : f.slots) n += HeapBytes(s.box);
  }
  for (const WriteItem& w : plan.writes) n += HeapBytes(w.region);
  for (const ProcessPlan& p : plan.per_process) {
    n += HeapBytes(p.files) + HeapBytes(p.writes) + HeapBytes(p.reads);
  }
  for (const Transfer& t : plan.transfers) n += HeapBytes(t.box);
  return n;
}

std::string PlanJson(const Plan& plan, const CheckpointIndex& index, bool details) {
  JsonWriter j(JsonWriter::Style::kCompact);
  j.BeginObject();
  j.Key("format").String("fc-plan").Key("version").Int(1);
  j.Key("kind").String(std::string(PlanKindName(plan.kind)));
  j.Key("processes").Int(plan.processes).Key("threads").Int(plan.threads);
  j.Key("memory").BeginObject(true);
  j.Key("budget").Uint(plan.memory.budget).Key("minimum").Uint(plan.memory.minimum);
  j.Key("peak").Uint(plan.memory.peak).Key("slab_bytes").Uint(plan.memory.slab_bytes);
  j.Key("block_bytes").Uint(plan.memory.block_bytes);
  j.Key("held").Uint(plan.memory.held).Key("plan_bytes").Uint(plan.memory.plan_bytes);
  j.Key("round_bytes").Uint(plan.memory.round_bytes);
  j.Key("io_buffers").Uint(plan.memory.io_buffers).EndObject();
  j.Key("bytes_needed").Uint(plan.bytes_needed).Key("bytes_written").Uint(plan.bytes_written);
  j.Key("write_items").Uint(plan.writes.size());
  j.Key("exchange").BeginObject(true);
  j.Key("rounds").Uint(plan.rounds).Key("rounds_lower_bound").Uint(plan.rounds_lower_bound);
  j.Key("transfers").Uint(plan.transfers.size());
  j.Key("read_balance").Fixed(plan.read_balance, 3).EndObject();
  j.Key("tensors").BeginArray();
  for (const PlanTensor& t : plan.tensors) {
    j.BeginObject(true).Key("name").String(t.name).Key("dtype").String(std::string(DTypeName(t.dtype)));
    j.Key("shape").BeginArray(true);
    for (int64_t d : t.shape) j.Int(d);
    j.EndArray();
    j.Key("pieces").Uint(t.pieces.size()).EndObject();
  }
  j.EndArray();
  j.Key("files").BeginArray();
  for (const PlanFile& f : plan.files) {
    j.BeginObject(true).Key("name").String(f.name).Key("process").Int(f.process);
    j.Key("bytes").Uint(f.bytes).Key("slots").Uint(f.slots.size()).EndObject();
  }
  j.EndArray();
  j.Key("per_process").BeginArray();
  for (size_t p = 0; p < plan.per_process.size(); ++p) {
    const ProcessPlan& pp = plan.per_process[p];
    j.BeginObject().Key("process").Int(static_cast<int64_t>(p));
    j.Key("files_written").Uint(pp.files.size()).Key("write_items").Uint(pp.writes.size());
    j.Key("bytes_written").Uint(pp.bytes_written).Key("bytes_read").Uint(pp.bytes_read);
    j.Key("bytes_sent").Uint(pp.bytes_sent).Key("bytes_received").Uint(pp.bytes_received);
    j.Key("reads").BeginArray();
    for (const SourceFileBytes& r : pp.reads) {
      j.BeginObject(true).Key("file").String(index.files[r.file].path).Key("bytes").Uint(r.bytes);
      j.EndObject();
    }
    j.EndArray().EndObject();
  }
  j.EndArray();
  if (details) {
    j.Key("writes").BeginArray();
    for (const WriteItem& w : plan.writes) {
      j.BeginObject(true).Key("file").Uint(w.file).Key("slot").Uint(w.slot);
      j.Key("tensor").String(plan.tensors[w.tensor].name);
      j.Key("region").String(w.region.ToString());
      j.Key("byte_offset").Uint(w.byte_offset).Key("bytes").Uint(w.bytes);
      j.Key("round").Uint(w.round).EndObject();
    }
    j.EndArray();
    j.Key("transfers").BeginArray();
    for (const Transfer& t : plan.transfers) {
      j.BeginObject(true).Key("round").Uint(t.round).Key("reader").Int(t.reader);
      j.Key("writer").Int(t.writer).Key("write").Uint(t.write);
      j.Key("source").String(t.source->key).Key("chunk").Uint(t.chunk);
      j.Key("box").String(t.box.ToString()).Key("bytes").Uint(t.bytes).EndObject();
    }
    j.EndArray();
  }
  j.EndObject();
  return j.str() + "\n";
}

}  // namespace fc
