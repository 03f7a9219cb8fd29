// fc-diff: compare two checkpoints tensor by tensor, whatever their formats and layouts.
//
// Exit status follows diff(1): 0 equal, 1 different. Errors keep the codes of the other
// tools (2 usage ... 10 resource exhausted), except an internal error, which is 1 elsewhere
// and 12 here.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "fc/format/chunk_reader.h"
#include "fc/io/env.h"
#include "fc/ops/diff.h"
#include "fc_config.h"

namespace {

constexpr int kDifferentExitCode = 1;
constexpr int kDiffInternalExitCode = 12;

int FinishWithError(const std::string& tool, const fc::Status& status) {
  const int code = fc::cli::Finish(tool, status);
  return status.code() == fc::StatusCode::kInternal ? kDiffInternalExitCode : code;
}

}  // namespace

int main(int argc, char** argv) {
  fc::DiffOptions options;
  std::string format_a, format_b, budget;
  double rtol = -1, atol = -1;
  bool quiet = false, verbose = false, json = false;
  CLI::App app{
      "fc-diff: compare two checkpoints (any formats and layouts) tensor by tensor, "
      "optionally through an AOA program on either side. Bit-exact by default (equal dtype, "
      "shape and bytes); with --rtol/--atol values are compared as float64 "
      "(|a - b| <= atol + rtol * |b|, B is the reference)."};
  app.add_option("A", options.a, "first checkpoint (any format fc reads: fc distcp, torch DCP, "
                                  "safetensors, Paddle, DeepSpeed, Megatron legacy)")
      ->required();
  app.add_option("B", options.b, "second checkpoint, the reference for --rtol")->required();
  app.add_option("--format-a", format_a, "force A's format: torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy")
      ->check(fc::cli::FormatCheck());
  app.add_option("--format-b", format_b, "force B's format: torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy")
      ->check(fc::cli::FormatCheck());
  app.add_option("--aoa-a", options.aoa_a, "AOA program applied to A (see fc-aoa(7))");
  app.add_option("--aoa-b", options.aoa_b, "AOA program applied to B");
  // Finite and >= 0; "nan" or "-1" is a usage error like any bad flag value.
  const CLI::Validator tolerance(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) &&
                        v >= 0;
        return ok ? std::string() : "value '" + text + "': a tolerance is a finite number >= 0";
      },
      "TOL");
  app.add_option("--rtol", rtol, "relative tolerance (compare values as float64)")->check(tolerance);
  app.add_option("--atol", atol, "absolute tolerance (compare values as float64)")->check(tolerance);
  app.add_flag("--equal-nan", options.equal_nan, "with --rtol/--atol: NaN equals NaN");
  app.add_flag("--only-common", options.only_common,
               "compare only the names both hold; the others are listed, not differences "
               "(e.g. an export against its source, which also holds optimizer states); "
               "no name in common is still exit 1");
  app.add_option("--include", options.include,
                 std::string("compare only names matching this ") + fc::cli::kGlobHelp)
      ->allow_extra_args(false);  // one pattern per flag, so A and B stay positional
  app.add_option("--exclude", options.exclude,
                 std::string("leave out names matching this ") + fc::cli::kGlobHelp)
      ->allow_extra_args(false);
  app.add_option("--memory-budget", budget,
                 "peak memory for tensor data, e.g. 4GB (default: a quarter of RAM)")
      ->check(fc::cli::SizeCheck());
  app.add_option("--threads", options.threads,
                 "worker threads (default: the cores this process may use, shared with the "
                 "job's other unbound processes on this node; at least 4 per node, as workers "
                 "also wait on the disk; at most 8)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print the report as one JSON object on stdout");
  app.add_flag("-q,--quiet", quiet, "no progress and no text report; only the exit status "
                                    "(--json is still printed)");
  app.add_flag("-v,--verbose", verbose, "debug logging");
  bool no_direct_io = false;
  fc::cli::AddNoDirectIoFlag(app, &no_direct_io);
  bool no_verify_checksums = false;
  app.add_flag("--no-verify-checksums", no_verify_checksums,
               "fc distcp input: read chunks without checking their xxh3-64 checksums "
               "(checked by default on every read; a mismatch is exit 5)");
  app.set_version_flag("--version", std::string("fc-diff ") + FC_VERSION);
  app.footer(
      "Examples:\n"
      "  fc-export ckpt/ hf/ && fc-diff ckpt/ hf/ --only-common\n"
      "  fc-diff megatron/ hf/ --aoa-a megatron_to_hf_llama.aoa\n"
      "  fc-diff ckpt/ hf_bf16/ --rtol 1e-2 --include 'model.layers.*' --json\n\n"
      "Exit status: 0 equal, 1 different, 2 usage, 3 invalid argument, 4 not found,\n"
      "5 corrupt input, 6 unsupported, 7 I/O error, 8 failed precondition,\n"
      "9 out of range, 10 resource exhausted, 12 internal error.");
  const std::string tool = "fc-diff";
  if (int code = fc::cli::ParseCommandLine(app, tool, argc, argv); code >= 0) return code;
  fc::cli::SetUpLogging(tool, quiet, verbose);
  fc::SetIoPolicy(fc::IoPolicy{fc::GetIoPolicy().follow_symlinks, !no_direct_io});
  fc::SetDefaultVerifyChecksums(!no_verify_checksums);
  for (auto [text, target] : {std::pair{&format_a, &options.format_a},
                              std::pair{&format_b, &options.format_b}}) {
    if (text->empty()) continue;
    auto parsed = fc::ParseCheckpointFormat(*text);
    if (!parsed.ok()) return FinishWithError(tool, parsed.status());
    *target = *parsed;
  }
  // CLI11 fills the doubles only when given (and checked them: finite, >= 0).
  if (app.count("--rtol")) options.rtol = rtol;
  if (app.count("--atol")) options.atol = atol;
  if (!budget.empty()) {
    auto b = fc::cli::ParseSize("--memory-budget", budget);
    if (!b.ok()) return FinishWithError(tool, b.status());
    options.memory_budget = *b;
  }
  if (quiet) options.progress = fc::Progress::Mode::kQuiet;
  spdlog::debug("comparing {} with {} (reference), {}", options.a, options.b,
                options.rtol || options.atol ? "within tolerances, as float64" : "bit-exact");
  auto report = fc::RunDiff(options);
  if (report.ok()) {
    spdlog::debug("{} tensor(s) compared, {} bytes", report->tensors_compared, report->bytes_compared);
  }
  if (!report.ok()) return FinishWithError(tool, report.status());
  if (json) {
    std::cout << fc::DiffReportJson(*report) << "\n";
  } else if (!quiet) {
    fc::WriteDiffText(*report, std::cout);
  }
  std::cout.flush();
  return report->equal() ? 0 : kDifferentExitCode;
}
