#include "fc/exec/execute.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "fc/core/flat_range.h"
#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"
#include "fc/io/env.h"

namespace fc {
namespace {

// Source elements for a round: those other processes sent for this one's items, else the
// files. A received transfer is found by its chunk and box, the very boxes the planner cut
// (a stored box of the chunk intersected with the block a piece asks for).
class ExchangedSourceReader final : public SourceReader {
 public:
  explicit ExchangedSourceReader(ChunkReader& chunks) : chunks_(chunks), files_(chunks) {}

  void Clear() { received_.clear(); }
  void Add(const Chunk* chunk, const Box& box, const std::byte* bytes) {
    received_[{chunk, box.global_offset, box.local_shape}] = bytes;
  }

  Status Read(const TensorEntry& tensor, const Box& src_sub, void* out,
              const Box& out_box) override {
    if (received_.empty()) return files_.Read(tensor, src_sub, out, out_box);
    const size_t esize = DTypeSize(tensor.dtype);
    for (const Chunk& chunk : tensor.chunks) {
      if (chunk.replica_id != 0) continue;
      if (!Intersect(chunk.box, src_sub)) continue;
      for (const Box& stored : StoredBoxes(chunk.box, chunk.flat_range)) {
        std::optional<Box> part = Intersect(stored, src_sub);
        if (!part || part->empty()) continue;
        auto it = received_.find({&chunk, part->global_offset, part->local_shape});
        if (it != received_.end()) {
          CopyRegion(it->second, *part, {}, out, out_box, *part, esize);
        } else {
          FC_RETURN_IF_ERROR(chunks_.CopyChunkRegion(tensor, chunk, *part, out, out_box));
        }
      }
    }
    return Status::Ok();
  }

 private:
  ChunkReader& chunks_;
  FileSourceReader files_;
  std::map<std::tuple<const Chunk*, Shape, Shape>, const std::byte*> received_;
};

// The progress display of one process's part of the job. With several processes, process 0
// shows the whole job: the others post their bytes written while their workers run
// (Communicator::PostCounter), process 0 polls them.
class JobProgress {
 public:
  // `options.process` must be in the plan.
  JobProgress(const Plan& plan, const ExecuteOptions& options)
      : comm_(options.comm),
        me_(options.process),
        whole_job_(comm_ != nullptr && comm_->size() > 1 && comm_->size() == plan.processes &&
                   comm_->rank() == me_),
        progress_(whole_job_ && me_ == 0 ? options.what + " (all processes)" : options.what,
                  whole_job_ && me_ == 0 ? plan.bytes_written
                                         : plan.per_process[static_cast<size_t>(me_)].bytes_written,
                  options.progress) {}

  void Add(uint64_t bytes) { progress_.Add(bytes); }

  // Runs `work` (which starts the workers) on a helper thread while this thread, the only
  // one that talks to the communicator, posts or polls the counters every quarter second.
  Status Reporting(const std::function<Status()>& work) {
    if (!whole_job_) return work();
    std::promise<Status> result;
    std::future<Status> done = result.get_future();
    std::thread helper([&] { result.set_value(work()); });
    do {
      if (me_ == 0) {
        ShowOthers(comm_->PollCounters());
      } else {
        comm_->PostCounter(progress_.done());
      }
    } while (done.wait_for(std::chrono::milliseconds(250)) != std::future_status::ready);
    helper.join();
    return done.get();
  }

  // Every process ends its counters (collective), failed or not: process 0's last line
  // shows every process's bytes. Prints the final line (`ok` as Progress::Finish) and
  // returns the bytes it counted.
  uint64_t Finish(bool ok) {
    if (whole_job_) {
      const std::vector<uint64_t> final_counts =
          comm_->EndCounters(me_ == 0 ? progress_.done() - others_shown_ : progress_.done());
      if (me_ == 0) ShowOthers(final_counts);
    }
    const uint64_t counted = progress_.done();
    progress_.Finish(ok);
    return counted;
  }

 private:
  // Process 0: adds what the other processes' counts show beyond what it showed already.
  void ShowOthers(const std::vector<uint64_t>& counts) {
    uint64_t others = 0;
    for (size_t r = 1; r < counts.size(); ++r) others += counts[r];
    if (others > others_shown_) {
      progress_.Add(others - others_shown_);
      others_shown_ = others;
    }
  }

  Communicator* const comm_;
  const int me_;
  const bool whole_job_;
  Progress progress_;
  uint64_t others_shown_ = 0;  // process 0: other processes' bytes added to its progress
};

using TransferIterator = std::vector<Transfer>::const_iterator;

// The exchange of one round, the transfers [first, last) of the plan, for process `me`:
// reads what it sends with `threads` workers, moves every message of the round at once, and
// hands what it received to `sources`, which points into `receive_buffers` (to be kept while
// the round's items are written). Failures are agreed on by all processes
// (Communicator::AllOk). Adds the bytes moved to `stats`; `exchange_peak` becomes at least
// the bytes of the round's buffers. `direct_io`: whether the workers may read with direct IO
// (PlanMemory::io_buffers).
Status ExchangeRound(TransferIterator first, TransferIterator last, int me, int threads,
                     bool direct_io, ChunkReader& reader, Communicator& comm,
                     ExchangedSourceReader& sources,
                     std::map<int, std::vector<std::byte>>& receive_buffers, ExecuteStats& stats,
                     uint64_t& exchange_peak) {
  // What this process sends: one message per receiver, transfers in plan order.
  std::vector<const Transfer*> outgoing;
  std::map<int, uint64_t> send_bytes, receive_bytes;
  for (auto t = first; t != last; ++t) {
    if (t->reader == me) {
      outgoing.push_back(&*t);
      send_bytes[t->writer] += t->bytes;
    }
    if (t->writer == me) receive_bytes[t->reader] += t->bytes;
  }
  std::map<int, std::vector<std::byte>> send_buffers;
  std::vector<uint64_t> offsets(outgoing.size());
  {
    std::map<int, uint64_t> at;
    for (size_t i = 0; i < outgoing.size(); ++i) {
      offsets[i] = at[outgoing[i]->writer];
      at[outgoing[i]->writer] += outgoing[i]->bytes;
    }
  }
  for (const auto& [peer, bytes] : send_bytes) send_buffers[peer].resize(bytes);
  Status read = ParallelFor(outgoing.size(), threads, [&](size_t i) -> Status {
    const ScopedThreadDirectIo direct(direct_io);
    const Transfer& t = *outgoing[i];
    std::byte* into = send_buffers[t.writer].data() + offsets[i];
    return reader.CopyChunkRegion(*t.source, t.source->chunks[t.chunk], t.box, into, t.box);
  });
  FC_RETURN_IF_ERROR(comm.AllOk(read));
  std::vector<Communicator::Message> sends, receives;
  for (auto& [peer, bytes] : send_buffers) sends.push_back({peer, bytes});
  for (const auto& [peer, bytes] : receive_bytes) {
    receive_buffers[peer].resize(bytes);
    receives.push_back({peer, receive_buffers[peer]});
  }
  uint64_t held = 0;
  for (const auto& [peer, bytes] : send_bytes) held += bytes;
  for (const auto& [peer, bytes] : receive_bytes) held += bytes;
  exchange_peak = std::max(exchange_peak, held);
  // Agreed: an NCCL exchange can fail on some processes only (a CUDA error, its step
  // timeout) while the others go on to the next collective; a failed process 0 would
  // then wait in EndCounters for the others' last counts forever.
  FC_RETURN_IF_ERROR(comm.AllOk(comm.Exchange(sends, receives)));
  for (const auto& [peer, bytes] : send_bytes) stats.bytes_sent += bytes;
  for (const auto& [peer, bytes] : receive_bytes) stats.bytes_received += bytes;
  send_buffers.clear();
  // Received transfers, unpacked in plan order per sender.
  sources.Clear();
  std::map<int, uint64_t> at;
  for (auto t = first; t != last; ++t) {
    if (t->writer != me) continue;
    uint64_t& offset = at[t->reader];
    sources.Add(&t->source->chunks[t->chunk], t->box, receive_buffers[t->reader].data() + offset);
    offset += t->bytes;
  }
  return Status::Ok();
}

}  // namespace

Result<ExecuteStats> Execute(const Plan& plan, ChunkReader& reader, PlanSink& sink,
                             const ExecuteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.process < 0 || static_cast<size_t>(options.process) >= plan.per_process.size()) {
    return InternalError("process " + std::to_string(options.process) + " is not in the plan");
  }
  const bool exchange = plan.rounds > 0;
  Communicator* comm = options.comm;
  if (exchange && (comm == nullptr || comm->rank() != options.process ||
                   comm->size() != plan.processes)) {
    return InternalError("a plan with transfers between " + std::to_string(plan.processes) +
                         " processes needs their communicator");
  }
  const int me = options.process;
  const ProcessPlan& mine = plan.per_process[static_cast<size_t>(me)];
  const int threads = std::max(1, plan.threads);
  // Room for one block per worker: a worker holds at most one while it copies from it.
  PieceBlockCache blocks(plan.memory.block_bytes * static_cast<uint64_t>(threads));
  for (const auto& [t, k] : plan.whole_blocks) blocks.Allow(&plan.tensors[t].pieces[k]);
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(threads));
  // The workers use direct IO only where the plan counted their bounce buffers.
  const bool direct_io = plan.memory.io_buffers > 0;
  JobProgress progress(plan, options);
  ExchangedSourceReader sources(reader);
  // Parts of checksummed chunks read ahead of the bytes before them wait for their hash
  // rather than being read again (fc/format/chunk_reader.h): in what the budget leaves
  // (ReorderAllowance), and at least 1 MiB, which the 64 MiB beyond the budget covers.
  reader.SetReorderLimit(std::max<uint64_t>(ReorderAllowance(plan.memory), 1u << 20));
  // Writes this process's items [first, last) of mine.writes.
  auto write_items = [&](size_t first, size_t last) {
    return progress.Reporting([&] {
      return ParallelFor(last - first, threads, [&](size_t i, int worker) -> Status {
      const ScopedThreadDirectIo direct(direct_io);
      const WriteItem& item = plan.writes[mine.writes[first + i]];
      const PlanTensor& tensor = plan.tensors[item.tensor];
      std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
      buffer.resize(item.bytes);
      FC_RETURN_IF_ERROR(AssembleRegion(sources, tensor.name, tensor.pieces, item.region,
                                        tensor.dtype, buffer.data(), &blocks));
      FC_RETURN_IF_ERROR(sink.Write(item.file, item.slot, item.byte_offset, buffer));
      progress.Add(buffer.size());
      return Status::Ok();
      });
    });
  };
  ExecuteStats stats;
  uint64_t exchange_peak = 0;
  Status status = Status::Ok();
  if (!exchange) {
    status = write_items(0, mine.writes.size());
    // Chunks read only in part have their checksums completed here, before anything commits.
    if (status.ok()) status = reader.FinishVerification();
  } else {
    size_t next_item = 0;
    auto transfer = plan.transfers.begin();
    for (uint32_t round = 0; round < plan.rounds && status.ok(); ++round) {
      auto round_end = std::find_if(transfer, plan.transfers.end(),
                                    [&](const Transfer& t) { return t.round != round; });
      std::map<int, std::vector<std::byte>> receive_buffers;
      status = ExchangeRound(transfer, round_end, me, threads, direct_io, reader, *comm, sources,
                             receive_buffers, stats, exchange_peak);
      if (!status.ok()) break;
      size_t last_item = next_item;
      while (last_item < mine.writes.size() && plan.writes[mine.writes[last_item]].round == round) {
        ++last_item;
      }
      status = comm->AllOk(write_items(next_item, last_item));
      next_item = last_item;
      transfer = round_end;
    }
    sources.Clear();
    if (status.ok() && next_item != mine.writes.size()) {
      status = InternalError("plan: " + std::to_string(mine.writes.size() - next_item) +
                             " write items of process " + std::to_string(me) +
                             " belong to no round");
    }
    // Checksums of chunks read only in part, completed (and agreed on) before anything
    // commits; every process gets here, failed or not, unless a round already failed.
    if (status.ok()) status = comm->AllOk(reader.FinishVerification());
  }
  stats.progress_bytes = progress.Finish(status.ok());
  FC_RETURN_IF_ERROR(status);
  stats.bytes_written = mine.bytes_written;
  uint64_t buffer_bytes = 0;
  for (const std::vector<std::byte>& b : buffers) buffer_bytes += b.capacity();
  stats.peak_buffer_bytes =
      buffer_bytes + blocks.peak_bytes() + exchange_peak + reader.reorder_peak_bytes();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace fc
