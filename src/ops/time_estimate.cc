#include "src/ops/time_estimate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "fc/io/file.h"
#include "fc/ops/report_format.h"

namespace fc {
namespace {

// "850 MB/s", "1.2 GB/s" (decimal units, as disks and networks are sold).
std::string Rate(double bytes_per_second) {
  char text[32];
  if (bytes_per_second >= 1e9) {
    std::snprintf(text, sizeof text, "%.1f GB/s", bytes_per_second / 1e9);
  } else {
    std::snprintf(text, sizeof text, "%.0f MB/s", bytes_per_second / 1e6);
  }
  return text;
}

}  // namespace

TimeEstimate EstimateTime(const Plan& plan, const Throughputs& rates) {
  TimeEstimate slowest;
  for (size_t p = 0; p < plan.per_process.size(); ++p) {
    const ProcessPlan& pp = plan.per_process[p];
    const uint64_t moved = pp.bytes_sent + pp.bytes_received;
    const double seconds = static_cast<double>(pp.bytes_read) / rates.read +
                           static_cast<double>(pp.bytes_written) / rates.write +
                           static_cast<double>(moved) / rates.network;
    if (p == 0 || seconds > slowest.seconds) {
      slowest = {seconds, p, pp.bytes_read, pp.bytes_written, moved};
    }
  }
  return slowest;
}

Throughputs MeasureThroughputs(const CheckpointIndex& index, const Plan& plan) {
  Throughputs rates;
  if (plan.per_process.empty() || plan.per_process[0].reads.empty()) return rates;
  // The file process 0 reads most of: what the real run spends its reading time on.
  const SourceFileBytes& most = *std::max_element(
      plan.per_process[0].reads.begin(), plan.per_process[0].reads.end(),
      [](const SourceFileBytes& a, const SourceFileBytes& b) { return a.bytes < b.bytes; });
  if (most.file >= index.files.size()) return rates;
  const FileInfo& info = index.files[most.file];
  if (info.size < kReadProbeMinBytes) return rates;
  Result<std::unique_ptr<RandomAccessFile>> file =
      RandomAccessFile::Open(JoinPath(index.root, info.path));
  if (!file.ok() || !(*file)->readable_here()) return rates;
  const uint64_t limit = std::min<uint64_t>(kReadProbeMaxBytes, (*file)->size());
  std::vector<std::byte> buffer(uint64_t{4} << 20);
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  double elapsed = 0;
  while (done < limit && elapsed < kReadProbeSeconds) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), limit - done);
    if (!(*file)->ReadAt(done, std::span<std::byte>(buffer.data(), n)).ok()) return rates;
    done += n;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (done < kReadProbeMinBytes || elapsed <= 0) return rates;
  rates.read = static_cast<double>(done) / elapsed;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f s", elapsed);
  rates.read_measured =
      HumanBytes(done) + " of " + ElideMiddle(info.path, 18) + " in " + seconds;
  return rates;
}

std::string HumanSeconds(double seconds) {
  char text[48];
  if (!(seconds < 1e9)) return "more than 30 years";
  if (seconds < 0.05) return "under 0.1 s";
  if (seconds < 60) {
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  } else if (seconds < 3600) {
    const long s = std::lround(seconds);
    std::snprintf(text, sizeof text, "%ld min %02ld s", s / 60, s % 60);
  } else {
    const long m = std::lround(seconds / 60);
    std::snprintf(text, sizeof text, "%ld h %02ld min", m / 60, m % 60);
  }
  return text;
}

void PrintTimeEstimate(const Plan& plan, const Throughputs& rates, std::ostream& out) {
  const TimeEstimate e = EstimateTime(plan, rates);
  std::string line = "time estimate: " + HumanSeconds(e.seconds) + " (slowest: process " +
                     std::to_string(e.slowest_process) + ", reads " + HumanBytes(e.read) +
                     ", writes " + HumanBytes(e.written);
  if (plan.processes > 1) line += ", moves " + HumanBytes(e.moved);
  out << line << ")\n";
  // "rates: read R (measured: ...), write W and network N assumed"; without a measurement
  // "rates: read R, write W and network N assumed"; one process: no network.
  const bool measured = !rates.read_measured.empty();
  std::string how = "rates: read " + Rate(rates.read) +
                    (measured ? " (measured: " + rates.read_measured + ")" : std::string());
  const bool network = plan.processes > 1;
  how += (network || measured ? ", write " : " and write ") + Rate(rates.write);
  if (network) how += " and network " + Rate(rates.network);
  out << ElideMiddle(how + " assumed", 120) << "\n";
}

}  // namespace fc
