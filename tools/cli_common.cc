#include "cli_common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

namespace fc::cli {

const char* ExitCodeHelp() {
  return "Exit status: 0 ok, 1 internal error, 2 usage, 3 invalid argument, 4 not found,\n"
         "5 corrupt input, 6 unsupported, 7 I/O error, 8 failed precondition,\n"
         "9 out of range, 10 resource exhausted, 11 verification failed.";
}

void SetUpLogging(const std::string& tool, bool quiet, bool verbose) {
  auto logger = spdlog::stderr_color_mt(tool);
  logger->set_pattern("%n: %v");
  logger->set_level(quiet ? spdlog::level::warn
                          : verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(logger);
}

int Finish(const std::string& tool, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), status.message().c_str());
  return ExitCodeFor(status.code());
}

}  // namespace fc::cli
