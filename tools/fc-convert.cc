// fc-convert: reshard a checkpoint into another parallel layout, optionally through AOA.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <iostream>
#include <vector>

#include "cli_common.h"
#include "fc/aoa/hf_family.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/output_format.h"
#include "fc/comm/communicator.h"
#include "fc/layout/layout_rules.h"
#include "fc/ops/convert.h"
#include "fc/ops/report_format.h"
#include "fc_config.h"

namespace {

constexpr const char* kTool = "fc-convert";

// The command line: ConvertOptions and the flags parsed into it after the checks.
struct ConvertCli {
  fc::ConvertOptions options;
  std::string format, old_input_format, dtype, budget, source_layout;
  std::string simulate_visibility = "per-rank";
  std::string transport_name = "mpi";
  int64_t ucp_step = -1;
  bool quiet = false, verbose = false, print_layout = false, follow_symlinks = false;
  bool no_direct_io = false;
  bool no_verify_checksums = false;
  CLI::Option_group* target = nullptr;
};

// CKPT, OUT, the input format and the target (one of four, with the preset's degrees).
void AddInputAndTargetOptions(CLI::App& app, ConvertCli& cli) {
  fc::ConvertOptions& options = cli.options;
  std::string& format = cli.format;
  std::string& source_layout = cli.source_layout;
  std::string presets;
  for (std::string_view p : fc::PresetNames()) presets += (presets.empty() ? "" : ", ") + std::string(p);
  app.add_option("CKPT", options.input, "input checkpoint (torch DCP incl. Megatron torch_dist, fc distcp, "
                 "safetensors, Paddle FlexCheckpoint, DeepSpeed, Megatron legacy); "
                 "required unless --print-layout");
  app.add_option("OUT", options.output_dir, "output directory (must not exist, or be empty, unless --overwrite)");
  app.add_option("--format", format, "force the input format: torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy")
      ->check(fc::cli::FormatCheck());
  app.add_option("--source-layout", source_layout, fc::cli::kSourceLayoutHelp);
  // The input-format flag of earlier versions; hidden (no help line), same meaning as --format.
  app.add_option("--input-format", cli.old_input_format)->group("");
  cli.target = app.add_option_group(
      "target", "where every chunk goes (exactly one; none with --output-format ucp or deepspeed)");
  cli.target->add_option("--target-like", options.target_like,
                     "take the chunk layout of this existing checkpoint (metadata only), e.g. "
                     "the step-0 checkpoint of the new run");
  cli.target->add_option("--target-layout", options.target_layout_file,
                     "degrees + rules JSON (schema in fc-layout(5))");
  cli.target->add_option("--preset", options.preset, "built-in rules: " + presets);
  cli.target->add_option("--target-manifest", options.target_manifest,
                     "a per-rank chunk manifest written by --emit-manifest");
  cli.target->require_option(0, 1);  // exactly one unless ucp / deepspeed: checked below
  app.add_option("--tp", options.degrees.tp, "with --preset: tensor-parallel degree");
  app.add_option("--pp", options.degrees.pp, "with --preset: pipeline-parallel degree");
  app.add_option("--dp", options.degrees.dp,
                 "with --preset: data-parallel (replica) degree; with --output-format "
                 "deepspeed: the new data-parallel size");
  app.add_option("--sharding", options.degrees.sharding,
                 "with --preset: ZeRO-1 sharding degree of flattened optimizer states");
  app.add_option("--ep", options.degrees.ep, "with --preset: expert-parallel degree");
  app.add_flag("--print-layout", cli.print_layout,
               "with --preset and its degrees, no CKPT: print the layout file (fc-layout(5)) "
               "the preset stands for, to edit and pass as --target-layout");
}

// Structure changes: AOA programs, the HF families, --copy-from, the filters and --dtype.
void AddStructureOptions(CLI::App& app, ConvertCli& cli) {
  fc::ConvertOptions& options = cli.options;
  auto* aoa = app.add_option("--aoa", options.aoa_file,
                             "AOA program for structure changes (fc-aoa(7)); with "
                             "--output-format ucp from a non-DeepSpeed source it renames and "
                             "reshapes each param with its Adam states");
  {
    std::vector<std::string> families(fc::aoa::HfFamilyNames().begin(),
                                      fc::aoa::HfFamilyNames().end());
    app.add_option("--hf-family", options.hf_family,
                   "Megatron-Core GPT (torch_dist or legacy) -> HuggingFace names, as fc-export "
                   "--hf-family: the AOA program generated from the checkpoint's facts and "
                   "--copy-from DIR's config.json (llama: Llama 2/3, Mistral; qwen2: Qwen2, QKV "
                   "bias; gpt2: GPT-2; mixtral: Mixtral MoE; qwen2-moe: Qwen2-MoE), e.g. with "
                   "--preset hf-llama; "
                   "fc-inspect --hf-family NAME "
                   "--print-aoa "
                   "prints it")
        ->check(CLI::IsMember(families))
        ->excludes(aoa);
  }
  {
    std::vector<std::string> families(fc::aoa::HfFamilyReverseNames().begin(),
                                      fc::aoa::HfFamilyReverseNames().end());
    app.add_option("--from-hf-family", options.from_hf_family,
                   "the reverse of --hf-family: a HuggingFace checkpoint (CKPT, with its "
                   "config.json) -> Megatron-Core GPT names and fused layouts (query-group "
                   "linear_qkv, SwiGLU linear_fc1 = [gate; up]) by the AOA program generated "
                   "from its shapes and config.json (llama: Llama 2/3, Mistral; qwen2: QKV "
                   "bias); with --target-like a Megatron torch_dist checkpoint (e.g. the new "
                   "run's step 0), its embedding rows (vocabulary padding), norm names and "
                   "key form, and with --output-format torch-dcp its metadata.json and "
                   "common.pt are copied into OUT")
        ->check(CLI::IsMember(families))
        ->excludes(aoa);
  }
  app.add_option("--copy-from", options.copy_from,
                 "copy config.json, tokenizer files and other small (<= 64 MiB) non-tensor "
                 "files of this directory (e.g. the HF model dir) into OUT (--output-format fc "
                 "and torch-dcp); with --hf-family, its config.json is the target's");
  app.add_option("--include", options.include,
                 std::string("write only target tensors whose name matches this ") +
                     fc::cli::kGlobHelp)
      ->allow_extra_args(false);  // one pattern per flag, so CKPT and OUT stay positional
  app.add_option("--exclude", options.exclude,
                 std::string("leave out target tensors whose name matches this ") +
                     fc::cli::kGlobHelp)
      ->allow_extra_args(false);
  app.add_option("--dtype", cli.dtype,
                 "cast floating-point target tensors: bfloat16, float16, float32, float64")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32", "float64"}));
}

// The output's format and its format-specific flags.
void AddOutputOptions(CLI::App& app, ConvertCli& cli) {
  fc::ConvertOptions& options = cli.options;
  std::string& out_format = options.output_format;
  std::string format_help = "output format:";
  std::vector<std::string> format_names;
  for (const fc::OutputFormat& f : fc::OutputFormats()) {
    format_help += "\n  " + std::string(f.name) + ": " + std::string(f.summary);
    format_names.emplace_back(f.name);
  }
  app.add_option("--output-format", out_format, format_help)
      ->check(CLI::IsMember(format_names));
  app.add_flag("--inject-missing-state", options.ucp_inject_missing_state,
               "with --output-format ucp: TP > 1 without universal_checkpoint_info: "
               "concatenate every param's TP slices along dim 0 (ds_to_universal.py "
               "--inject_missing_state) instead of refusing");
  app.add_flag("--ucp-zero3", options.ucp_zero3,
               "with --output-format ucp from a checkpoint DeepSpeed did not write: the form "
               "DeepSpeed's ZeRO-3 loader reads (raw flat param files, no step.pt, "
               "zero_pp_rank_0_mp_rank_00_model_states.pt; default: the ZeRO 1/2 form)");
  app.add_flag("--ucp-fresh-optimizer", options.ucp_fresh_optimizer,
               "with --output-format ucp from weights without Adam states (e.g. HF "
               "safetensors): every floating-point tensor a param, with zero exp_avg and "
               "exp_avg_sq and step 0 (a fresh optimizer, as hf_to_universal.py)");
  app.add_option("--ucp-step", cli.ucp_step,
                 "with --output-format ucp from a source that stores no Adam step (PaddlePaddle, "
                 "Megatron torch_dist without common.pt): the step written to every param's "
                 "step.pt (the iteration the optimizer states belong to); refused where the "
                 "source has one")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--torch-version", options.torch_version,
                 "with --output-format torch-dcp: metadata for torch 1.13, 2.0 (torch 2.0-2.3: "
                 "no storage_meta, no version) or 2 (torch 2.4+: storage_meta and version "
                 "\"1.0.0\", as current torch writes) (default: that of a torch DCP source, "
                 "else 2)")
      ->check(CLI::IsMember({"1.13", "2.0", "2"}));
  app.add_option("--torch-serialization", options.torch_serialization,
                 "with --output-format torch-dcp --torch-version 2: torch-save (default: one torch.save "
                 "archive per chunk, what torch's FileSystemReader loads) or safetensors (torch "
                 "~2.8's SAFETENSORS serialization: one safetensors blob per file, one chunk "
                 "per tensor per file)")
      ->check(CLI::IsMember({"torch-save", "safetensors"}));
  app.add_option("--emit-manifest", options.emit_manifest,
                 "write the resolved per-rank chunk list as JSON");
  app.add_flag("--overwrite", options.overwrite,
               "replace OUT if it holds a checkpoint (an earlier output): the new output is built "
               "beside it and swapped in once complete, so OUT holds the old or the new, never "
               "a part; a directory of other files, a file or a symlink is refused (exit 8)");
}

// --dry-run and its reports, resources, logging, and the help's footer.
void AddRunOptions(CLI::App& app, ConvertCli& cli) {
  fc::ConvertOptions& options = cli.options;
  app.add_flag("--dry-run", options.dry_run,
               "print the plan (per target rank: chunks, bytes written, source files and bytes "
               "read, estimated peak memory) and write nothing");
  app.add_flag("--json", options.json, "with --dry-run: the plan as JSON (fc-plan(5))");
  app.add_option("--simulate-processes", options.simulate_processes,
                 "with --dry-run: plan for N processes without starting them (reads, "
                 "transfers, rounds, balance)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--simulate-visibility", cli.simulate_visibility,
                 "with --simulate-processes: 'per-rank' (each process sees the files of its "
                 "source ranks, as on node-local disks; default) or 'shared'")
      ->check(CLI::IsMember({"per-rank", "shared"}));
  app.add_option("--stats", options.stats_file,
                 "after the run, write measured figures (bytes read/written, calls, peak "
                 "buffers, seconds per process) as JSON to this file");
  app.add_option("--memory-budget", cli.budget, "peak memory for tensor data (default: RAM/4)")
      ->check(fc::cli::SizeCheck());
  app.add_option("--threads", options.threads,
                 "worker threads (default: the cores this process may use, shared with the "
                 "job's other unbound processes on this node; at least 4 per node, as workers "
                 "also wait on the disk; at most 8)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--follow-symlinks", cli.follow_symlinks,
               "read checkpoint files that are symlinks pointing outside the checkpoint "
               "directory (refused by default)");
  fc::cli::AddNoDirectIoFlag(app, &cli.no_direct_io);
  fc::cli::AddTransportOption(app, &cli.transport_name);
  app.add_flag("-q,--quiet", cli.quiet, "no progress, notes or warnings; errors only");
  app.add_flag("-v,--verbose", cli.verbose, "debug logging");
  app.add_flag("--no-verify-checksums", cli.no_verify_checksums,
               "fc distcp input: read chunks without checking their xxh3-64 checksums "
               "(checked by default on every read; a mismatch is exit 5)");
  app.set_version_flag("--version", std::string("fc-convert ") + FC_VERSION);
  app.footer(std::string(
                 "Examples:\n"
                 "  fc-convert old/ new/ --target-like step0_of_new_run/\n"
                 "  fc-convert old/ new/ --preset megatron-gpt --tp 2 --pp 2 --sharding 4 --dry-run\n"
                 "  fc-convert ds/global_step100 ds/universal --output-format ucp\n"
                 "  fc-convert fsdp_dcp/ tp1/ --target-like tp1_run/ --output-format torch-dcp --aoa qkv.aoa\n"
                 "  fc-convert megatron/ hf_dcp/ --hf-family llama --copy-from hf_model/ --preset hf-llama --tp 1 --output-format torch-dcp\n"
                 "  fc-convert hf_model/ megatron/ --from-hf-family llama --target-like step0/ --output-format torch-dcp\n\n") +
             fc::cli::ExitCodeHelp());
}

// --print-layout: the preset's layout file, no checkpoint read.
int PrintLayout(const CLI::App& app, const ConvertCli& cli) {
  const std::string tool = kTool;
  const fc::ConvertOptions& options = cli.options;
  // Reads no checkpoint: every other input would have no effect.
  if (options.preset.empty()) return fc::cli::UsageError(tool, "--print-layout needs --preset NAME");
  if (!options.input.empty() || app.count("--dry-run") || app.count("--output-format") ||
      app.count("--aoa") || app.count("--hf-family") || app.count("--from-hf-family") ||
      app.count("--copy-from")) {
    return fc::cli::UsageError(tool, "--print-layout prints the preset's layout file and "
                               "reads no checkpoint: leave out CKPT, OUT, --dry-run, "
                               "--output-format, --aoa, --hf-family, --from-hf-family and "
                               "--copy-from");
  }
  auto rules = fc::PresetRules(options.preset, options.degrees);
  if (!rules.ok()) return fc::cli::Finish(tool, rules.status());
  std::cout << fc::LayoutRulesJson(*rules) << "\n";
  return 0;
}

// Flags that would have no effect, or that exclude each other, refused (usage, exit 2) rather
// than ignored. -1: none.
int CheckFlags(const CLI::App& app, ConvertCli& cli) {
  const std::string tool = kTool;
  fc::ConvertOptions& options = cli.options;
  const std::string& out_format = options.output_format;
  CLI::Option_group* target = cli.target;
  if (options.input.empty()) return fc::cli::UsageError(tool, "CKPT is required");
  // Flags that would have no effect are refused rather than ignored.
  if (options.json && !options.dry_run) return fc::cli::UsageError(tool, "--json needs --dry-run");
  if (options.simulate_processes > 0 && !options.dry_run) {
    return fc::cli::UsageError(tool, "--simulate-processes needs --dry-run");
  }
  options.simulate_shared = cli.simulate_visibility == "shared";
  if (!options.dry_run && options.output_dir.empty()) {
    return fc::cli::UsageError(tool, "OUT is required unless --dry-run");
  }
  const bool no_target = out_format == "ucp" || out_format == "deepspeed";
  if (out_format == "deepspeed" && !app.count("--dp")) {
    return fc::cli::UsageError(tool, "--output-format deepspeed needs --dp N (the new "
                               "data-parallel size)");
  }
  if (options.preset.empty()) {
    for (const char* degree : {"--tp", "--pp", "--dp", "--sharding", "--ep"}) {
      if (out_format == "deepspeed" && std::string(degree) == "--dp") continue;
      if (out_format == "deepspeed" && app.count(degree)) {
        return fc::cli::UsageError(tool, "--output-format deepspeed changes the data-parallel "
                                   "size only (--dp); TP, PP, sharding and EP stay as the "
                                   "source has them: " + std::string(degree) +
                                   " does not apply");
      }
      if (app.count(degree)) {
        return fc::cli::UsageError(tool, std::string(degree) + " applies to --preset only (the "
                                   "degrees of --target-like, --target-layout and "
                                   "--target-manifest come from that target)");
      }
    }
  }
  if (no_target && (app.count("--hf-family") || app.count("--copy-from"))) {
    return fc::cli::UsageError(tool, std::string(app.count("--hf-family") ? "--hf-family" : "--copy-from") +
                               " applies to --output-format fc and torch-dcp, not " + out_format);
  }
  if (app.count("--from-hf-family") && app.count("--hf-family")) {
    return fc::cli::UsageError(tool, "--from-hf-family (HF -> Megatron) and --hf-family "
                               "(Megatron -> HF) exclude each other");
  }
  if (no_target && app.count("--from-hf-family")) {
    return fc::cli::UsageError(tool, "--from-hf-family applies to --output-format fc and "
                               "torch-dcp, not " + out_format);
  }
  if (app.count("--hf-family") && !app.count("--copy-from")) {
    return fc::cli::UsageError(tool, "--hf-family needs --copy-from DIR (the HuggingFace model "
                               "directory whose config.json the program is made for)");
  }
  if (out_format == "ucp" && target->count_all() > 0) {
    return fc::cli::UsageError(tool, "--output-format ucp takes no target (every param is "
                               "written whole): leave out --target-like, --target-layout, "
                               "--preset and --target-manifest");
  }
  if (out_format == "deepspeed" && target->count_all() > 0) {
    return fc::cli::UsageError(tool, "--output-format deepspeed takes no target (the layout is "
                               "DeepSpeed's for --dp N): leave out --target-like, "
                               "--target-layout, --preset and --target-manifest");
  }
  if (out_format == "deepspeed" && app.count("--source-layout")) {
    return fc::cli::UsageError(tool, "--source-layout has no effect with --output-format "
                               "deepspeed: the TP shards are written as they are");
  }
  if (!no_target && target->count_all() == 0) {
    return fc::cli::UsageError(tool, "give exactly one target: --target-like, --target-layout, "
                               "--preset or --target-manifest");
  }
  if (options.ucp_zero3 && out_format != "ucp") {
    return fc::cli::UsageError(tool, "--ucp-zero3 applies to --output-format ucp only");
  }
  if (options.ucp_fresh_optimizer && out_format != "ucp") {
    return fc::cli::UsageError(tool, "--ucp-fresh-optimizer applies to --output-format ucp only");
  }
  if (cli.ucp_step >= 0) {
    if (out_format != "ucp") {
      return fc::cli::UsageError(tool, "--ucp-step applies to --output-format ucp only");
    }
    if (options.ucp_fresh_optimizer) {
      return fc::cli::UsageError(tool, "--ucp-step does not apply with --ucp-fresh-optimizer "
                                 "(zero moments go with step 0)");
    }
    options.ucp_step = cli.ucp_step;
  }
  if (options.ucp_inject_missing_state && out_format != "ucp") {
    return fc::cli::UsageError(tool, "--inject-missing-state applies to --output-format ucp only");
  }
  if (!options.torch_version.empty() && out_format != "torch-dcp") {
    return fc::cli::UsageError(tool, "--torch-version applies to --output-format torch-dcp only");
  }
  return -1;
}

// The checked flags into the options, and the process's logging and IO set up. -1: done.
int ApplyFlags(ConvertCli& cli) {
  const std::string tool = kTool;
  fc::ConvertOptions& options = cli.options;
  std::string& format = cli.format;
  const std::string& old_input_format = cli.old_input_format;
  if (!old_input_format.empty()) {
    if (!format.empty()) return fc::cli::UsageError(tool, "give --format only (--input-format is its old name)");
    // The hidden old name gets no CLI11 check (its errors would carry no flag name).
    if (auto parsed = fc::ParseCheckpointFormat(old_input_format); !parsed.ok()) {
      return fc::cli::UsageError(tool, "--input-format: " + parsed.status().message());
    }
    format = old_input_format;
  }
  fc::cli::SetUpLogging(tool, cli.quiet, cli.verbose);
  fc::SetDefaultVerifyChecksums(!cli.no_verify_checksums);
  fc::cli::SetUpIo(cli.follow_symlinks, !cli.no_direct_io);
  if (!cli.dtype.empty()) options.dtype = *fc::ParseDType(cli.dtype);
  if (!format.empty()) {
    auto parsed = fc::ParseCheckpointFormat(format);
    if (!parsed.ok()) return fc::cli::Finish(tool, parsed.status());
    options.format = *parsed;
  }
  if (!cli.source_layout.empty()) {
    auto split = fc::cli::LoadSourceLayout(cli.source_layout);
    if (!split.ok()) return fc::cli::Finish(tool, split.status());
    options.source_split = *std::move(split);
  }
  if (!cli.budget.empty()) {
    auto b = fc::cli::ParseSize("--memory-budget", cli.budget);
    if (!b.ok()) return fc::cli::Finish(tool, b.status());
    options.memory_budget = *b;
  }
  return -1;
}

// The lead process's line after a run that wrote OUT.
void ReportWritten(const fc::ConvertOptions& options, const fc::ConvertSummary& summary) {
  const std::string& out_format = options.output_format;
  if (out_format == "ucp") {
    spdlog::info("wrote a Universal Checkpoint: {} file(s) ({}), {} copied, to {}",
                 summary.chunks, fc::HumanBytes(summary.bytes_written), summary.objects,
                 options.output_dir);
  } else if (out_format == "deepspeed") {
    spdlog::info("wrote a DeepSpeed checkpoint for dp {}: {} archive(s) ({}), {} file(s) "
                 "copied, to {}", summary.ranks, summary.chunks,
                 fc::HumanBytes(summary.bytes_written), summary.objects, options.output_dir);
  } else {
    spdlog::info("wrote {} chunks for {} rank(s) ({}), {} object(s), to {}", summary.chunks,
                 summary.ranks, fc::HumanBytes(summary.bytes_written), summary.objects,
                 options.output_dir);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ConvertCli cli;
  fc::ConvertOptions& options = cli.options;
  CLI::App app{
      "fc-convert: reshard a distributed checkpoint (TP, PP, DP, ZeRO/sharding with flattened "
      "optimizer state, EP) into another layout, optionally changing its structure with an "
      "AOA program, and write it as an fc distcp checkpoint (with checksums), a PyTorch DCP checkpoint, a DeepSpeed "
      "checkpoint at another DP size or a DeepSpeed Universal Checkpoint. Planning reads "
      "no tensor bytes (opening Megatron and DeepSpeed checkpoints reads a few, to find and check where "
      "optimizer states lie); the output directory appears only when complete."};
  AddInputAndTargetOptions(app, cli);
  AddStructureOptions(app, cli);
  AddOutputOptions(app, cli);
  AddRunOptions(app, cli);
  const std::string tool = kTool;
  if (int code = fc::cli::ParseCommandLine(app, tool, argc, argv); code >= 0) return code;
  if (cli.print_layout) return PrintLayout(app, cli);
  if (int code = CheckFlags(app, cli); code >= 0) return code;
  if (int code = ApplyFlags(cli); code >= 0) return code;
  fc::Transport transport;
  if (int code = fc::cli::CheckTransportOption(app, tool, cli.transport_name, &transport);
      code >= 0) {
    return code;
  }
  auto comm = fc::MakeCommunicatorFromEnvironment(&argc, &argv, transport);
  if (!comm.ok()) return fc::cli::FinishStartup(tool, comm.status());
  if ((*comm)->size() > 1) options.comm = comm->get();
  const bool lead = (*comm)->rank() == 0;
  if (cli.quiet || !lead) options.progress = fc::Progress::Mode::kQuiet;
  auto summary = fc::RunConvert(options, std::cout);
  std::cout.flush();
  if (!summary.ok()) {
    // Every process returns the same error; one report is enough.
    return lead ? fc::cli::Finish(tool, summary.status()) : fc::cli::ExitCode(summary.status());
  }
  if (!options.dry_run && lead) ReportWritten(options, *summary);
  return 0;
}
