#include "src/ops/plan_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "fc/ops/report_format.h"

namespace fc {

void PrintProcessReport(const Plan& plan, std::ostream& out) {
  if (plan.processes < 2) return;
  char balance[32];
  std::snprintf(balance, sizeof balance, "%.3f", plan.read_balance);
  uint64_t moved = 0;
  for (const ProcessPlan& pp : plan.per_process) moved += pp.bytes_sent;
  out << "exchange: " << HumanBytes(moved) << " in " << plan.transfers.size()
      << " transfer(s), " << plan.rounds << " round(s) (lower bound " << plan.rounds_lower_bound
      << ", " << HumanBytes(plan.memory.round_bytes) << " per process and round)\n";
  out << "read balance: " << balance << " (most bytes read by a process / mean)\n";
  std::vector<size_t> order(plan.per_process.size());
  std::iota(order.begin(), order.end(), 0);
  constexpr size_t kAll = 32, kShown = 16;
  if (order.size() > kAll) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return plan.per_process[a].bytes_read > plan.per_process[b].bytes_read;
    });
    order.resize(kShown);
  }
  TextTable table({"PROCESS", "READ", "SEND", "RECEIVE", "WRITE", "FILES"});
  for (size_t p : order) {
    const ProcessPlan& pp = plan.per_process[p];
    table.AddRow({std::to_string(p), HumanBytes(pp.bytes_read), HumanBytes(pp.bytes_sent),
                  HumanBytes(pp.bytes_received), HumanBytes(pp.bytes_written),
                  std::to_string(pp.files.size())});
  }
  table.Print(out);
  if (order.size() < plan.per_process.size()) {
    out << "(the " << order.size() << " processes that read most of "
        << plan.per_process.size() << "; --json lists all)\n";
  }
}

}  // namespace fc
