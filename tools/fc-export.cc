// fc-export: full-parameter export of a distributed checkpoint to HuggingFace safetensors.
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "fc/aoa/hf_family.h"
#include "fc/format/chunk_reader.h"
#include "fc/comm/communicator.h"
#include "fc/ops/export.h"
#include "fc/ops/report_format.h"
#include "fc_config.h"

int main(int argc, char** argv) {
  fc::ExportOptions options;
  std::string format, dtype, max_shard = "5GB", budget, objects;
  bool quiet = false, verbose = false;
  CLI::App app{
      "fc-export: write the full (unsharded) tensors of a distributed checkpoint as "
      "HuggingFace safetensors: model.safetensors, or model-0000i-of-0000N.safetensors plus "
      "model.safetensors.index.json. Streams under a memory budget; output files appear only "
      "when complete."};
  app.add_option("CKPT", options.input, "input checkpoint (torch DCP, fc distcp, safetensors, Paddle FlexCheckpoint, DeepSpeed save or tag dir, Megatron legacy save or iter dir)")
      ->required();
  app.add_option("OUT", options.output_dir, "output directory (created if missing; must be empty unless --overwrite)")->required();
  app.add_option("--format", format, "force the input format: torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy")
      ->check(fc::cli::FormatCheck());
  std::string source_layout;
  app.add_option("--source-layout", source_layout, fc::cli::kSourceLayoutHelp);
  app.add_option("--aoa", options.aoa_file,
                 "AOA program: rename/split/merge/transpose/cast tensors on the way out "
                 "(see fc-aoa(7)); outputs are the leaves of the program");
  {
    std::vector<std::string> families(fc::aoa::HfFamilyNames().begin(), fc::aoa::HfFamilyNames().end());
    app.add_option("--hf-family", options.hf_family,
                   "Megatron-Core GPT (torch_dist or legacy) -> HuggingFace names: the AOA program "
                   "generated from the checkpoint's facts and --copy-from DIR's config.json "
                   "(llama: Llama 2/3, Mistral; qwen2: Qwen2, QKV bias; gpt2: GPT-2; mixtral: Mixtral "
                   "MoE; qwen2-moe: Qwen2-MoE, shared expert); fc-inspect "
                   "--hf-family NAME --print-aoa prints it")
        ->check(CLI::IsMember(families))
        ->excludes("--aoa");
  }
  app.add_option("--dtype", dtype, "cast floating-point tensors: bfloat16, float16, float32, float64")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32", "float64"}));
  app.add_option("--max-shard-size", max_shard,
                 "largest tensor data per output file, e.g. 5GB (default), 500MB, 2GiB")
      ->check(fc::cli::SizeCheck());
  app.add_option("--include", options.include,
                 std::string("export only output names matching this ") + fc::cli::kGlobHelp)
      ->allow_extra_args(false);  // one pattern per flag, so CKPT and OUT stay positional
  app.add_option("--exclude", options.exclude,
                 std::string("leave out output names matching this ") + fc::cli::kGlobHelp)
      ->allow_extra_args(false);
  app.add_flag("--include-optimizer", options.include_optimizer,
               "also export optimizer states (exp_avg, exp_avg_sq, fp32 master weights, ...)");
  app.add_option("--memory-budget", budget,
                 "peak memory for tensor data, e.g. 4GB (default: a quarter of RAM)")
      ->check(fc::cli::SizeCheck());
  app.add_option("--threads", options.threads,
                 "worker threads (default: the cores this process may use, shared with the "
                 "job's other unbound processes on this node; at least 4 per node, as workers "
                 "also wait on the disk; at most 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--objects", options.objects_dir,
                 "write non-tensor objects (iteration, RNG state, ...) as files into this "
                 "directory (default: skip them with a note)");
  app.add_option("--copy-from", options.copy_from,
                 "copy config.json, generation_config.json, tokenizer files and other small "
                 "(<= 64 MiB) non-tensor files of this directory (e.g. the original HF model "
                 "dir) into OUT with the export");
  app.add_flag("--overwrite", options.overwrite,
               "replace OUT if it holds a checkpoint (an earlier output): the new output is built "
               "beside it and swapped in once complete, so OUT holds the old or the new, never "
               "a part; a directory of other files, a file or a symlink is refused (exit 8)");
  app.add_flag("--dry-run", options.dry_run,
               "plan only: print output files, bytes to read and write, memory; write nothing");
  app.add_flag("--json", options.json, "with --dry-run: the whole plan as JSON (fc-plan(5))");
  app.add_option("--stats", options.stats_file,
                 "after the run, write measured figures (bytes read/written, calls, peak "
                 "buffers, seconds per process) as JSON to this file");
  app.add_option("--weights", options.weights,
                 "which weights to export under the parameter names. DeepSpeed input: fp32 "
                 "(default; the fp32 master weights from the ZeRO optimizer files) or module "
                 "(the 16-bit module weights of the model states). Megatron legacy input: "
                 "module (default; the model weights) or fp32 (the fp32 master weights of the "
                 "distributed or Float16 optimizer)")
      ->check(CLI::IsMember({"fp32", "module"}));
  bool follow_symlinks = false;
  app.add_flag("--follow-symlinks", follow_symlinks,
               "read checkpoint files that are symlinks pointing outside the checkpoint "
               "directory (refused by default)");
  bool no_direct_io = false;
  fc::cli::AddNoDirectIoFlag(app, &no_direct_io);
  std::string transport_name = "mpi";
  fc::cli::AddTransportOption(app, &transport_name);
  app.add_flag("-q,--quiet", quiet, "no progress, notes or warnings; errors only");
  app.add_flag("-v,--verbose", verbose, "debug logging");
  bool no_verify_checksums = false;
  app.add_flag("--no-verify-checksums", no_verify_checksums,
               "fc distcp input: read chunks without checking their xxh3-64 checksums "
               "(checked by default on every read; a mismatch is exit 5)");
  app.set_version_flag("--version", std::string("fc-export ") + FC_VERSION);
  app.footer(std::string(
                 "Examples:\n"
                 "  fc-export ckpt/ hf/                        # fp32 weights as HF safetensors\n"
                 "  fc-export ckpt/ hf/ --dtype bfloat16 --max-shard-size 2GB --copy-from hf_model/\n"
                 "  fc-export ckpt/ hf/ --dry-run              # plan, checks and time estimate only\n"
                 "  mpirun -np 4 fc-export ckpt/ hf/           # same bytes, four readers/writers\n\n") +
             fc::cli::ExitCodeHelp());
  const std::string tool = "fc-export";
  if (int code = fc::cli::ParseCommandLine(app, tool, argc, argv); code >= 0) return code;
  if (options.json && !options.dry_run) return fc::cli::UsageError(tool, "--json needs --dry-run");
  fc::cli::SetUpLogging(tool, quiet, verbose);
  fc::SetDefaultVerifyChecksums(!no_verify_checksums);
  fc::cli::SetUpIo(follow_symlinks, !no_direct_io);
  if (!format.empty()) {
    auto parsed = fc::ParseCheckpointFormat(format);
    if (!parsed.ok()) return fc::cli::Finish(tool, parsed.status());
    options.format = *parsed;
  }
  if (!source_layout.empty()) {
    auto split = fc::cli::LoadSourceLayout(source_layout);
    if (!split.ok()) return fc::cli::Finish(tool, split.status());
    options.source_split = *std::move(split);
  }
  if (!dtype.empty()) options.dtype = *fc::ParseDType(dtype);
  auto shard = fc::cli::ParseSize("--max-shard-size", max_shard);
  if (!shard.ok()) return fc::cli::Finish(tool, shard.status());
  options.max_shard_bytes = *shard;
  if (!budget.empty()) {
    auto b = fc::cli::ParseSize("--memory-budget", budget);
    if (!b.ok()) return fc::cli::Finish(tool, b.status());
    options.memory_budget = *b;
  }
  fc::Transport transport;
  if (int code = fc::cli::CheckTransportOption(app, tool, transport_name, &transport); code >= 0) {
    return code;
  }
  auto comm = fc::MakeCommunicatorFromEnvironment(&argc, &argv, transport);
  if (!comm.ok()) return fc::cli::FinishStartup(tool, comm.status());
  if ((*comm)->size() > 1) options.comm = comm->get();
  const bool lead = (*comm)->rank() == 0;
  if (quiet || !lead) options.progress = fc::Progress::Mode::kQuiet;
  auto summary = fc::RunExport(options, std::cout);
  if (!summary.ok()) {
    // Every process returns the same error; one report is enough.
    return lead ? fc::cli::Finish(tool, summary.status()) : fc::cli::ExitCode(summary.status());
  }
  if (!lead || options.dry_run) return 0;
  spdlog::info("wrote {} tensors ({}) in {} file(s) to {}", summary->tensors,
               fc::HumanBytes(summary->tensor_bytes), summary->files.size(), options.output_dir);
  return 0;
}
