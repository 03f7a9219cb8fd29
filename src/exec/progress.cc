#include "fc/exec/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "fc/core/human_bytes.h"

namespace fc {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Duration(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) {
    snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else {
    snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

Progress::Progress(std::string what, uint64_t total_bytes, Mode mode, double line_interval)
    : what_(std::move(what)), total_(total_bytes), mode_(mode), interval_(line_interval),
      start_seconds_(NowSeconds()) {
  if (mode_ == Mode::kAuto) mode_ = isatty(STDERR_FILENO) ? Mode::kBar : Mode::kLines;
  if (mode_ != Mode::kQuiet) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() { Finish(true); }

void Progress::Finish(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (mode_ != Mode::kQuiet) Draw(true, ok);
}

void Progress::Loop() {
  const double period = mode_ == Mode::kBar ? 0.2 : interval_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(period), [this] { return stop_; });
    if (!stop_) Draw(false, true);
  }
}

void Progress::Draw(bool final_line, bool ok) {
  const double elapsed = NowSeconds() - start_seconds_;
  const double done = static_cast<double>(done_.load(std::memory_order_relaxed));
  const double rate = elapsed > 0 ? done / elapsed : 0;
  const double fraction = total_ > 0 ? done / static_cast<double>(total_) : 1.0;
  std::string line = what_ + ": " + HumanBytes(static_cast<uint64_t>(done)) + " / " +
                     HumanBytes(total_) + ", " + HumanBytes(static_cast<uint64_t>(rate)) + "/s";
  if (final_line) {
    line += ok ? ", done in " : ", stopped after ";
    line += Duration(elapsed);
  } else if (rate > 0 && fraction < 1) {
    line += ", ETA " + Duration((static_cast<double>(total_) - done) / rate);
  }
  if (mode_ == Mode::kBar) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, ' ') + "] ";
    char pct[16];
    snprintf(pct, sizeof pct, "%3.0f%% ", fraction * 100);
    std::fprintf(stderr, "\r\033[K%s%s%s%s", bar.c_str(), pct, line.c_str(),
                 final_line ? "\n" : "");
  } else {
    char pct[16];
    snprintf(pct, sizeof pct, "%.0f%%: ", fraction * 100);
    std::fprintf(stderr, "%s%s\n", pct, line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace fc
