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

}  // namespace

Status PlanExchange(Plan& plan, const std::vector<std::vector<int>>& visibility,
                    uint64_t round_budget, bool chunk_affinity, SourceIndexes& indexes) {
  const int processes = plan.processes;
  const auto P = static_cast<size_t>(processes);
  // 1. Needs, per write item, in each writer's execution order.
  std::vector<Need> needs;
  std::vector<std::vector<uint32_t>> item_needs(plan.writes.size());
  std::map<std::tuple<int, uint32_t, uint32_t>, std::vector<uint32_t>> whole_needs;
  int wholes = 0;
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

  // Units the readers are chosen for: one need each, or, when checksums are verified, every
  // need of one checksummed chunk together (one process then reads all of the chunk the job
  // needs and hashes it in one pass, not again to verify parts others read).
  std::vector<int> everyone(P);
  std::iota(everyone.begin(), everyone.end(), 0);
  auto candidates = [&](uint32_t file) -> const std::vector<int>& {
    return visibility.empty() ? everyone : visibility[file];
  };
  for (const Need& n : needs) {
    if (!visibility.empty() && (n.file >= visibility.size() || visibility[n.file].empty())) {
      return NotFoundError("source file #" + std::to_string(n.file) + " (holding '" +
                           n.source->key + "' " + n.box.ToString() +
                           ") is visible to no process");
    }
  }
  struct Unit {
    uint32_t file = 0;
    uint64_t bytes = 0;
    int writer = 0;  // the writer of most of its bytes that sees the file, or -1
    int reader = -1;
    std::vector<uint32_t> needs;
  };
  std::vector<Unit> units;
  {
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
  }
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
  for (const Unit& u : units) {
    for (uint32_t i : u.needs) needs[i].reader = u.reader;
  }
  const uint64_t max_load = *std::max_element(load.begin(), load.end());
  plan.read_balance = total == 0 ? 1.0
                                 : static_cast<double>(max_load) * static_cast<double>(P) /
                                       static_cast<double>(total);

  // Reads per process and source file: every need once (a whole block once per writer).
  std::vector<std::map<uint32_t, uint64_t>> reads(P);
  for (const Need& n : needs) reads[static_cast<size_t>(n.reader)][n.file] += n.bytes;

  // 4. Rounds. The cap admits the largest single item (all its blocks included).
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
  std::vector<size_t> next(P, 0);
  std::vector<uint64_t> sent(P), received(P);
  std::vector<int> delivered(static_cast<size_t>(wholes), -1);  // round a block last went in
  std::vector<uint64_t> total_sent(P, 0), total_received(P, 0);
  uint32_t round = 0;
  uint64_t most_in_round = 0;  // what a process sends or receives in its busiest round
  bool any_transfer = false;
  auto remaining = [&] {
    for (size_t p = 0; p < P; ++p) {
      if (next[p] < plan.per_process[p].writes.size()) return true;
    }
    return false;
  };
  std::vector<uint32_t> times_sent(needs.size(), 0);
  std::vector<std::pair<int, uint64_t>> out;  // (reader, bytes) of one item
  while (remaining()) {
    std::fill(sent.begin(), sent.end(), 0);
    std::fill(received.begin(), received.end(), 0);
    for (size_t turn = 0; turn < P; ++turn) {
      const size_t p = (turn + round) % P;
      const std::vector<uint32_t>& writes = plan.per_process[p].writes;
      while (next[p] < writes.size()) {
        const uint32_t w = writes[next[p]];
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
        if (!fits) break;
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
        ++next[p];
      }
    }
    for (size_t p = 0; p < P; ++p) most_in_round = std::max({most_in_round, sent[p], received[p]});
    ++round;
  }
  std::stable_sort(plan.transfers.begin(), plan.transfers.end(),
                   [](const Transfer& a, const Transfer& b) {
                     return std::tie(a.round, a.reader, a.writer, a.write) <
                            std::tie(b.round, b.reader, b.writer, b.write);
                   });
  if (any_transfer) {
    plan.rounds = round;
    uint64_t most = 0;
    for (size_t p = 0; p < P; ++p) most = std::max({most, total_sent[p], total_received[p]});
    plan.rounds_lower_bound = static_cast<uint32_t>((most + cap - 1) / cap);
  } else {
    plan.rounds = 0;
    plan.rounds_lower_bound = 0;
    for (WriteItem& w : plan.writes) w.round = 0;
  }
  plan.memory.round_bytes = any_transfer ? most_in_round : 0;
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
