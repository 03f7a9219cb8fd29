// Progress reporting for long runs: a redrawn bar on stderr when it is a terminal (bytes
// done / total, rate, ETA), plain log lines every few seconds otherwise, nothing when quiet.
//
// Thread-safety: Add() may be called from any thread; a background thread draws.
#ifndef FC_EXEC_PROGRESS_H_
#define FC_EXEC_PROGRESS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace fc {

class Progress {
 public:
  enum class Mode { kAuto, kBar, kLines, kQuiet };

  // Starts drawing. `what` names the job ("exporting").
  Progress(std::string what, uint64_t total_bytes, Mode mode = Mode::kAuto,
           double line_interval_seconds = 10.0);
  ~Progress();  // stops and prints a final line (unless quiet)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes) { done_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t done() const { return done_.load(std::memory_order_relaxed); }
  // Stops drawing and prints the final line now; `ok` selects "done" or "stopped".
  void Finish(bool ok);

 private:
  void Loop();
  void Draw(bool final_line, bool ok);

  std::string what_;
  uint64_t total_;
  Mode mode_;
  double interval_;
  std::atomic<uint64_t> done_{0};
  double start_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace fc

#endif  // FC_EXEC_PROGRESS_H_
