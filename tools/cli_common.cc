#include "cli_common.h"

#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/layout/layout_rules.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace fc::cli {

const char* ExitCodeHelp() {
  return "Exit status: 0 ok, 1 internal error, 2 usage, 3 invalid argument, 4 not found,\n"
         "5 corrupt input, 6 unsupported, 7 I/O error, 8 failed precondition,\n"
         "9 out of range, 10 resource exhausted, 11 verification failed.";
}

int ParseCommandLine(CLI::App& app, const std::string& tool, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\nRun with --help for more information.\n", tool.c_str(),
                 e.what());
    return kUsageExitCode;
  }
  return -1;
}

int UsageError(const std::string& tool, const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), message.c_str());
  return kUsageExitCode;
}

namespace {

// The out-of-memory message, built before it is needed (printing it must not allocate).
char g_oom_message[256];
size_t g_oom_message_size = 0;
std::terminate_handler g_previous_terminate = nullptr;

// std::terminate handler: an uncaught std::bad_alloc (main thread or a worker) is exit 10;
// anything else goes on to the previous handler (message and abort).
[[noreturn]] void OnTerminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      [[maybe_unused]] ssize_t n = write(STDERR_FILENO, g_oom_message, g_oom_message_size);
      _exit(10);
    } catch (...) {
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void SetUpOutOfMemoryExit(const std::string& tool) {
  const int n = std::snprintf(
      g_oom_message, sizeof(g_oom_message),
      "%s: error: out of memory (std::bad_alloc): the input needs more memory than the "
      "process may use; lower --memory-budget or --threads, or run with more memory "
      "(exit 10)\n",
      tool.c_str());
  g_oom_message_size = n < 0 ? 0 : std::min<size_t>(static_cast<size_t>(n), sizeof(g_oom_message) - 1);
  g_previous_terminate = std::set_terminate(OnTerminate);
}

}  // namespace

void SetUpLogging(const std::string& tool, bool quiet, bool verbose) {
  SetUpOutOfMemoryExit(tool);
  auto logger = spdlog::stderr_color_mt(tool);
  logger->set_pattern("%n: %v");
  logger->set_level(quiet ? spdlog::level::err
                          : verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(logger);
}

Result<SourceSplit> LoadSourceLayout(const std::string& path) {
  const std::string origin = "--source-layout " + path;
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(path, 256ull << 20).With(origin));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  FC_ASSIGN_OR_RETURN(LayoutRules rules, ParseLayoutRules(text).With(origin));
  SourceSplit split;
  FC_ASSIGN_OR_RETURN(split.tp_axis, TensorParallelAxisOf(rules).With(origin));
  split.origin = origin;
  return split;
}

Result<uint64_t> ParseSize(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  std::string number = text.substr(0, pos), unit;
  for (char c : text.substr(pos)) {
    if (c != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  double multiplier = 0;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "k" || unit == "kb") multiplier = 1e3;
  else if (unit == "m" || unit == "mb") multiplier = 1e6;
  else if (unit == "g" || unit == "gb") multiplier = 1e9;
  else if (unit == "t" || unit == "tb") multiplier = 1e12;
  else if (unit == "kib") multiplier = 1024.0;
  else if (unit == "mib") multiplier = 1024.0 * 1024;
  else if (unit == "gib") multiplier = 1024.0 * 1024 * 1024;
  else if (unit == "tib") multiplier = 1024.0 * 1024 * 1024 * 1024;
  char* end = nullptr;
  const double value = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (multiplier == 0 || value < 0 || end != number.c_str() + number.size() ||
      value * multiplier >= 1.8e19) {
    return InvalidArgumentError(flag + " '" + text + "': expected a size such as 5GB, 512MiB or 1000000");
  }
  return static_cast<uint64_t>(value * multiplier);
}

CLI::Validator SizeCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto parsed = ParseSize("value", text);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "");
}

CLI::Validator FormatCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto parsed = ParseCheckpointFormat(text);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "");
}

namespace {

// Async-signal-safe: stores the signal number; a second signal gets the default action.
extern "C" void OnStopSignal(int sig) {
  if (CancelSignal() != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  RequestCancel(sig);
}

}  // namespace

void SetUpIo(bool follow_symlinks, bool direct_io) {
  SetIoPolicy(IoPolicy{follow_symlinks, direct_io});
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void AddNoDirectIoFlag(CLI::App& app, bool* no_direct_io) {
  app.add_flag("--no-direct-io", *no_direct_io,
               "read and write through the page cache only (default: writes of 1 MiB or more "
               "to an output file under 1 GiB, or of any size once 64 MiB of input came off "
               "the disk, and reads of 64 KiB or more from an input file mostly out of the "
               "page cache, use O_DIRECT where the file system allows it)");
}

int ExitCode(const Status& status) {
  if (status.ok()) return 0;
  if (const int sig = CancelSignal(); sig != 0) return 128 + sig;
  return ExitCodeFor(status.code());
}

int Finish(const std::string& tool, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), status.message().c_str());
  return ExitCode(status);
}

void AddTransportOption(CLI::App& app, std::string* name) {
  app.add_option("--transport", *name,
                 "under mpirun: what carries tensor bytes between processes: mpi (default) "
                 "or nccl (an fc built with NCCL, a CUDA device per process; bytes staged "
                 "through device memory)")
      ->check(CLI::IsMember({"mpi", "nccl"}));
}

int CheckTransportOption(const CLI::App& app, const std::string& tool, const std::string& name,
                         Transport* transport) {
  *transport = name == "nccl" ? Transport::kNccl : Transport::kMpi;
  if (app.count("--transport") == 0 || StartedByMpiLauncher()) return -1;
  if (Status s = CheckTransport(*transport); !s.ok()) return Finish(tool, s);
  return UsageError(tool, "--transport applies under mpirun only (one process exchanges "
                          "nothing)");
}

int FinishStartup(const std::string& tool, const Status& status) {
  const std::string& m = status.message();
  size_t digits = 5;
  while (digits < m.size() && m[digits] >= '0' && m[digits] <= '9') ++digits;
  const bool agreed = m.rfind("rank ", 0) == 0 && digits > 5 && m.compare(digits, 2, ": ") == 0;
  return !agreed || LauncherRank() == 0 ? Finish(tool, status) : ExitCode(status);
}

}  // namespace fc::cli
