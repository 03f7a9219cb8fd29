#include "src/plan/exchange.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace fc {
namespace {

struct Need {
  const TensorEntry* source = nullptr;
  uint32_t chunk = 0;
  uint32_t file = 0;
  Box box;
  uint64_t bytes = 0;
  int writer = 0;
  int whole = -1;  // index of the (writer, tensor, piece) block it belongs to, or -1
  int reader = -1;
};

// Cut point over the mean where reads are moved, and the bound the issue of balance sets.
constexpr double kMoveAbove = 1.10;

// 1. Needs, per write item, in each writer's execution order. A whole block's needs are
// listed once per writer and shared by its items; Need::whole numbers the blocks (`wholes`).
struct Needs {
  std::vector<Need> needs;
  std::vector<std::vector<uint32_t>> item_needs;  // per write item: indexes into `needs`
  int wholes = 0;
};

Needs ListNeeds(const Plan& plan, SourceIndexes& indexes) {
  const auto P = static_cast<size_t>(plan.processes);
  Needs listed;
  std::vector<Need>& needs = listed.needs;
  std::vector<std::vector<uint32_t>>& item_needs = listed.item_needs;
  int& wholes = listed.wholes;
  item_needs.resize(plan.writes.size());
  std::map<std::tuple<int, uint32_t, uint32_t>, std::vector<uint32_t>> whole_needs;
  for (size_t p = 0; p < P; ++p) {
    for (uint32_t w : plan.per_process[p].writes) {
      const WriteItem& item = plan.writes[w];
      std::vector<uint32_t>& mine = item_needs[w];
      ForEachItemSource(plan, item, [&](uint32_t k, const SourcePiece& piece, bool whole,
                                        const Box& src) {
        auto add = [&](std::vector<uint32_t>& into, int whole_id) {
          indexes.Of(piece.source).ForEach(src, [&](const Box& b, uint32_t file, uint32_t chunk) {
            into.push_back(static_cast<uint32_t>(needs.size()));
            needs.push_back({piece.source, chunk, file, b,
                             static_cast<uint64_t>(b.num_elements()) * DTypeSize(piece.source->dtype),
                             static_cast<int>(p), whole_id, -1});
          });
        };
        if (!whole) {
          add(mine, -1);
          return;
        }
        auto key = std::make_tuple(static_cast<int>(p), item.tensor, k);
        auto it = whole_needs.find(key);
        if (it == whole_needs.end()) {
          std::vector<uint32_t> made;
          add(made, wholes++);
          it = whole_needs.emplace(key, std::move(made)).first;
        }
        mine.insert(mine.end(), it->second.begin(), it->second.end());
      });
    }
  }
  return listed;
}

// kNotFound for the first need whose file no process sees (`visibility` as PlanExchange's).
Status CheckVisible(const std::vector<Need>& needs,
                    const std::vector<std::vector<int>>& visibility) {
  for (const Need& n : needs) {
    if (!visibility.empty() && (n.file >= visibility.size() || visibility[n.file].empty())) {
      return NotFoundError("source file #" + std::to_string(n.file) + " (holding '" +
                           n.source->key + "' " + n.box.ToString() +
                           ") is visible to no process");
    }
  }
  return Status::Ok();
}

// The processes that can read a source file: those `visibility` lists (which must outlive
// this), or all `processes` when it is empty.
class Candidates {
 public:
  Candidates(const std::vector<std::vector<int>>& visibility, size_t processes)
      : visibility_(visibility), everyone_(processes) {
    std::iota(everyone_.begin(), everyone_.end(), 0);
  }
  const std::vector<int>& operator()(uint32_t file) const {
    return visibility_.empty() ? everyone_ : visibility_[file];
  }

 private:
  const std::vector<std::vector<int>>& visibility_;
  std::vector<int> everyone_;
};

struct Unit {
  uint32_t file = 0;
  uint64_t bytes = 0;
  int writer = 0;  // the writer of most of its bytes that sees the file, or -1
  int reader = -1;
  std::vector<uint32_t> needs;
};

// Units the readers are chosen for: one need each, or, when checksums are verified, every
// need of one checksummed chunk together (one process then reads all of the chunk the job
// needs and hashes it in one pass, not again to verify parts others read).
std::vector<Unit> GroupUnits(const std::vector<Need>& needs, bool chunk_affinity,
                             const Candidates& candidates) {
  std::vector<Unit> units;
  std::map<std::pair<const TensorEntry*, uint32_t>, uint32_t> unit_of_chunk;
  for (uint32_t i = 0; i < needs.size(); ++i) {
    const Need& n = needs[i];
    const bool together = chunk_affinity && n.source->chunks[n.chunk].xxh3_64.has_value();
    uint32_t u = static_cast<uint32_t>(units.size());
    if (together) {
      auto [it, added] = unit_of_chunk.emplace(std::make_pair(n.source, n.chunk), u);
      u = it->second;
      if (added) units.push_back({n.file, 0, -1, -1, {}});
    } else {
      units.push_back({n.file, 0, -1, -1, {}});
    }
    units[u].bytes += n.bytes;
    units[u].needs.push_back(i);
  }
  std::map<int, uint64_t> by_writer;
  for (Unit& u : units) {
    by_writer.clear();
    const std::vector<int>& c = candidates(u.file);
    for (uint32_t i : u.needs) {
      if (std::binary_search(c.begin(), c.end(), needs[i].writer)) {
        by_writer[needs[i].writer] += needs[i].bytes;
      }
    }
    uint64_t most = 0;
    for (const auto& [w, b] : by_writer) {  // ties: the lowest rank
      if (b > most) {
        most = b;
        u.writer = w;
      }
    }
  }
  return units;
}

// 2. and 3.: every unit's reader, of P processes. Returns the read balance: the most bytes a
// process reads over the mean (1 when nothing is read).
double ChooseReaders(std::vector<Unit>& units, const Candidates& candidates, size_t P) {
  // 2. Readers: the writer when it sees the file, else the least loaded that does.
  std::vector<uint64_t> load(P, 0);
  auto least_loaded = [&](const std::vector<int>& among, int except) {
    int best = -1;
    for (int c : among) {
      if (c == except) continue;
      if (best < 0 || load[static_cast<size_t>(c)] < load[static_cast<size_t>(best)]) best = c;
    }
    return best;
  };
  for (Unit& u : units) {
    u.reader = u.writer >= 0 ? u.writer : least_loaded(candidates(u.file), -1);
    load[static_cast<size_t>(u.reader)] += u.bytes;
  }
  // 3. Balance: move units off processes above kMoveAbove x the mean.
  const uint64_t total = std::accumulate(load.begin(), load.end(), uint64_t{0});
  const double mark = kMoveAbove * static_cast<double>(total) / static_cast<double>(P);
  for (int pass = 0; pass < 3 && P > 1; ++pass) {
    bool moved = false;
    for (Unit& u : units) {
      if (static_cast<double>(load[static_cast<size_t>(u.reader)]) <= mark) continue;
      const int to = least_loaded(candidates(u.file), u.reader);
      if (to < 0 || static_cast<double>(load[static_cast<size_t>(to)] + u.bytes) > mark) continue;
      load[static_cast<size_t>(u.reader)] -= u.bytes;
      load[static_cast<size_t>(to)] += u.bytes;
      u.reader = to;
      moved = true;
    }
    if (!moved) break;
  }
  const uint64_t max_load = *std::max_element(load.begin(), load.end());
  return total == 0 ? 1.0
                    : static_cast<double>(max_load) * static_cast<double>(P) /
                          static_cast<double>(total);
}

// 4. The rounds' cap: `round_budget`, raised to admit the largest single item (all its
// blocks included).
uint64_t RoundCap(const Plan& plan, const Needs& listed, uint64_t round_budget) {
  const std::vector<Need>& needs = listed.needs;
  const std::vector<std::vector<uint32_t>>& item_needs = listed.item_needs;
  uint64_t cap = std::max<uint64_t>(round_budget, 1);
  std::map<int, uint64_t> item_out;
  for (size_t w = 0; w < plan.writes.size(); ++w) {
    uint64_t in = 0;
    item_out.clear();
    for (uint32_t i : item_needs[w]) {
      const Need& n = needs[i];
      if (n.reader == n.writer) continue;
      in += n.bytes;
      item_out[n.reader] += n.bytes;
    }
    cap = std::max(cap, in);
    for (const auto& [reader, bytes] : item_out) cap = std::max(cap, bytes);
  }
  return cap;
}

// 4. Rounds: Run() gives every write item its round (WriteItem::round) and lists the
// transfers (plan.transfers, in the order taken); a block sent again is read again
// (`reads`, per process and source file, grows). The figures stay for PlanExchange.
struct RoundPlanner {
  RoundPlanner(Plan& plan, const Needs& listed, uint64_t cap,
               std::vector<std::map<uint32_t, uint64_t>>& reads)
      : plan(plan), needs(listed.needs), item_needs(listed.item_needs), cap(cap), reads(reads),
        P(static_cast<size_t>(plan.processes)), next(P, 0), sent(P), received(P),
        delivered(static_cast<size_t>(listed.wholes), -1), total_sent(P, 0),
        total_received(P, 0), times_sent(needs.size(), 0) {}

  // Round by round, every writer in turn (from a different one each round) takes its next
  // items while they fit.
  void Run() {
    while (remaining()) {
      std::fill(sent.begin(), sent.end(), 0);
      std::fill(received.begin(), received.end(), 0);
      for (size_t turn = 0; turn < P; ++turn) {
        const size_t p = (turn + round) % P;
        const std::vector<uint32_t>& writes = plan.per_process[p].writes;
        while (next[p] < writes.size() && TakeItem(p, writes[next[p]])) ++next[p];
      }
      for (size_t p = 0; p < P; ++p) {
        most_in_round = std::max({most_in_round, sent[p], received[p]});
      }
      ++round;
    }
  }

  bool remaining() const {
    for (size_t p = 0; p < P; ++p) {
      if (next[p] < plan.per_process[p].writes.size()) return true;
    }
    return false;
  }

  // Puts item w of writer p in this round, with its transfers, when what p receives and what
  // each of its readers sends stay within the cap; false, and nothing changed, otherwise.
  bool TakeItem(size_t p, uint32_t w) {
    uint64_t in = 0;
    out.clear();
    for (uint32_t i : item_needs[w]) {
      const Need& n = needs[i];
      if (n.reader == n.writer) continue;
      if (n.whole >= 0 && delivered[static_cast<size_t>(n.whole)] == static_cast<int>(round)) {
        continue;
      }
      in += n.bytes;
      out.emplace_back(n.reader, n.bytes);
    }
    bool fits = received[p] + in <= cap;
    std::map<int, uint64_t> per_reader;
    for (const auto& [r, b] : out) per_reader[r] += b;
    for (const auto& [r, b] : per_reader) fits = fits && sent[static_cast<size_t>(r)] + b <= cap;
    if (!fits) return false;
    plan.writes[w].round = round;
    received[p] += in;
    total_received[p] += in;
    for (const auto& [r, b] : per_reader) {
      sent[static_cast<size_t>(r)] += b;
      total_sent[static_cast<size_t>(r)] += b;
    }
    for (uint32_t i : item_needs[w]) {
      const Need& n = needs[i];
      if (n.reader == n.writer) continue;
      if (n.whole >= 0) {
        int& when = delivered[static_cast<size_t>(n.whole)];
        if (when == static_cast<int>(round)) continue;
      }
      plan.transfers.push_back({round, n.reader, n.writer, w, n.source, n.chunk, n.box,
                                n.bytes});
      // A block sent again is read again.
      if (times_sent[i]++ > 0) reads[static_cast<size_t>(n.reader)][n.file] += n.bytes;
      any_transfer = true;
    }
    // Marked after the item's needs are listed: one block's needs all go together.
    for (uint32_t i : item_needs[w]) {
      const Need& n = needs[i];
      if (n.whole >= 0 && n.reader != n.writer) {
        delivered[static_cast<size_t>(n.whole)] = static_cast<int>(round);
      }
    }
    return true;
  }

  Plan& plan;
  const std::vector<Need>& needs;
  const std::vector<std::vector<uint32_t>>& item_needs;
  const uint64_t cap;
  std::vector<std::map<uint32_t, uint64_t>>& reads;
  const size_t P;
  std::vector<size_t> next;              // per writer: its next item in per_process writes
  std::vector<uint64_t> sent, received;  // per process, in this round
  std::vector<int> delivered;  // round a block last went in
  std::vector<uint64_t> total_sent, total_received;
  std::vector<uint32_t> times_sent;  // per need
  uint32_t round = 0;  // this round; once Run() returns, the number of rounds
  uint64_t most_in_round = 0;  // what a process sends or receives in its busiest round
  bool any_transfer = false;
  std::vector<std::pair<int, uint64_t>> out;  // (reader, bytes) of one item
};

}  // namespace

Status PlanExchange(Plan& plan, const std::vector<std::vector<int>>& visibility,
                    uint64_t round_budget, bool chunk_affinity, SourceIndexes& indexes) {
  const auto P = static_cast<size_t>(plan.processes);
  Needs listed = ListNeeds(plan, indexes);
  std::vector<Need>& needs = listed.needs;
  FC_RETURN_IF_ERROR(CheckVisible(needs, visibility));
  const Candidates candidates(visibility, P);
  std::vector<Unit> units = GroupUnits(needs, chunk_affinity, candidates);
  plan.read_balance = ChooseReaders(units, candidates, P);
  for (const Unit& u : units) {
    for (uint32_t i : u.needs) needs[i].reader = u.reader;
  }

  // Reads per process and source file: every need once (a whole block once per writer).
  std::vector<std::map<uint32_t, uint64_t>> reads(P);
  for (const Need& n : needs) reads[static_cast<size_t>(n.reader)][n.file] += n.bytes;

  const uint64_t cap = RoundCap(plan, listed, round_budget);
  RoundPlanner rounds(plan, listed, cap, reads);
  rounds.Run();
  std::stable_sort(plan.transfers.begin(), plan.transfers.end(),
                   [](const Transfer& a, const Transfer& b) {
                     return std::tie(a.round, a.reader, a.writer, a.write) <
                            std::tie(b.round, b.reader, b.writer, b.write);
                   });
  const std::vector<uint64_t>& total_sent = rounds.total_sent;
  const std::vector<uint64_t>& total_received = rounds.total_received;
  if (rounds.any_transfer) {
    plan.rounds = rounds.round;
    uint64_t most = 0;
    for (size_t p = 0; p < P; ++p) most = std::max({most, total_sent[p], total_received[p]});
    plan.rounds_lower_bound = static_cast<uint32_t>((most + cap - 1) / cap);
  } else {
    plan.rounds = 0;
    plan.rounds_lower_bound = 0;
    for (WriteItem& w : plan.writes) w.round = 0;
  }
  plan.memory.round_bytes = rounds.any_transfer ? rounds.most_in_round : 0;
  for (size_t p = 0; p < P; ++p) {
    ProcessPlan& pp = plan.per_process[p];
    pp.reads.clear();
    pp.bytes_read = 0;
    for (const auto& [file, bytes] : reads[p]) {
      pp.reads.push_back({file, bytes});
      pp.bytes_read += bytes;
    }
    pp.bytes_sent = total_sent[p];
    pp.bytes_received = total_received[p];
  }
  return Status::Ok();
}

}  // namespace fc
