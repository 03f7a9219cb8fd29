// What the three fc tools share: logging setup, mapping a final Status to the exit-code
// table, and the `--version` string. Tools stay thin: parse flags into an Options struct,
// call one library entry point, report.
#ifndef FC_TOOLS_CLI_COMMON_H_
#define FC_TOOLS_CLI_COMMON_H_

#include <string>

#include <CLI/CLI.hpp>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/format/open.h"

namespace fc::cli {

// Exit code for a command-line usage error (CLI11 parse failures).
inline constexpr int kUsageExitCode = 2;

// Parses the command line. Returns -1 when the tool should go on; otherwise the exit code:
// 0 after --help / --version, kUsageExitCode after a parse error, printed as
// "<tool>: error: <message>" plus a pointer to --help (the same form in every tool).
int ParseCommandLine(CLI::App& app, const std::string& tool, int argc, char** argv);

// A flag combination or value the command line cannot mean: prints "<tool>: error: <message>"
// and returns kUsageExitCode.
int UsageError(const std::string& tool, const std::string& message);

// Help text for --include / --exclude in every tool.
inline constexpr const char* kGlobHelp = "glob (* ? [..]), whole name; repeatable";

// The EXIT STATUS table, as printed in --help footers and the man pages.
const char* ExitCodeHelp();

// Sets spdlog to print "fc-export: message" lines on stderr; quiet keeps errors only (no
// notes, no warnings), verbose enables debug.
// code handles (in any thread) prints "<tool>: error: out of memory (std::bad_alloc) ...
// (exit 10)" and exits with 10 (resource exhausted) instead of aborting.
void SetUpLogging(const std::string& tool, bool quiet, bool verbose);

// Parses "5GB" (10^9), "512MiB" (2^20), "64k", "1000" (bytes); case-insensitive units
// B, K/KB, M/MB, G/GB, T/TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024).
// Errors: kInvalidArgument naming `flag` and the text.
Result<uint64_t> ParseSize(const std::string& flag, const std::string& text);

// One rule for flag values in every tool: a value that is not in its flag's own syntax (a
// size, a number, a name from a fixed list) is a usage error, exit 2, found while the
// command line is parsed; exit 3 (invalid argument) is for what a value holds or means (an
// AOA program, a glob, a layout file, a target that does not fit the checkpoint). These
// CLI11 checks give the usage error, with ParseSize's / ParseCheckpointFormat's message:
//   app.add_option("--memory-budget", budget, "...")->check(fc::cli::SizeCheck());
CLI::Validator SizeCheck();
CLI::Validator FormatCheck();  // a checkpoint format name (fc/model/checkpoint_index.h)

// Process-wide IO setup, before any file is opened: the IO policy (--follow-symlinks,
// --no-direct-io; fc/io/env.h IoPolicy) and SIGINT/SIGTERM handlers. The first signal asks
// the run to stop (RequestCancel: every later file operation fails, the run unwinds and
// removes its staging directory, and the tool exits 128 + signal); a second one terminates
// at once.
void SetUpIo(bool follow_symlinks, bool direct_io = true);

// --no-direct-io (fc-export, fc-convert): large reads and writes through the page cache.
void AddNoDirectIoFlag(CLI::App& app, bool* no_direct_io);

// --source-layout FILE: a layout file (man/fc-layout.5) whose tensor_parallel rules say how
// a Megatron legacy or DeepSpeed checkpoint's TP ranks merge (fc/format/open.h SourceSplit).
inline constexpr const char* kSourceLayoutHelp =
    "how the TP ranks of a Megatron legacy or DeepSpeed checkpoint merge: a layout file "
    "(fc-layout(5)) whose tensor_parallel rules replace the built-in table (Megatron) or "
    "universal_checkpoint_info (DeepSpeed); a name no rule matches is replicated";
// Errors: the file's read and parse errors, naming it.
Result<SourceSplit> LoadSourceLayout(const std::string& path);

// The exit code for a final status: ExitCodeFor, or 128 + N after signal N stopped the run.
int ExitCode(const Status& status);

// Prints "<tool>: error: <message>" to stderr (when not OK) and returns ExitCode(status).
int Finish(const std::string& tool, const Status& status);

// --transport mpi|nccl (fc-export, fc-convert): what carries bytes between processes.
void AddTransportOption(CLI::App& app, std::string* name);
// Checks --transport before anything runs; -1 when the tool should go on (with
// *transport set), else the exit code after printing the error. Outside mpirun the flag
// has no effect (usage error), but a capability that is missing (`--transport nccl` in a
// build without NCCL: exit 6; no CUDA device: exit 8) is said first.
int CheckTransportOption(const CLI::App& app, const std::string& tool, const std::string& name,
                         Transport* transport);
// Finish for MakeCommunicatorFromEnvironment's error: an error every process agreed on
// ("rank R: ...") is printed by process 0 only; one found by this process alone, by it.
int FinishStartup(const std::string& tool, const Status& status);

}  // namespace fc::cli

#endif  // FC_TOOLS_CLI_COMMON_H_
