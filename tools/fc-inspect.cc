// fc-inspect: show what a checkpoint holds, verify it, or preview an AOA program on it.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli_common.h"
#include "fc/aoa/hf_family.h"
#include "fc/ops/inspect.h"
#include "fc_config.h"

int main(int argc, char** argv) {
  fc::InspectOptions options;
  std::string format;
  CLI::App app{
      "fc-inspect: print the tensors, dtypes, shapes, chunk layout and files of a "
      "distributed checkpoint (PyTorch DCP incl. Megatron torch_dist, safetensors or HF "
      "sharded safetensors, fc distcp); verify it; preview an AOA program on it."};
  app.add_option("CKPT", options.path, "checkpoint directory (or .safetensors file; DeepSpeed: save dir with latest, or a tag dir; Megatron legacy: save dir with latest_checkpointed_iteration.txt, or an iter dir)")
      ->required();
  app.add_option("--format", format, "force the input format: torch-dcp, safetensors, fc, paddle, deepspeed, megatron-legacy")
      ->check(fc::cli::FormatCheck());
  std::string source_layout;
  app.add_option("--source-layout", source_layout, fc::cli::kSourceLayoutHelp);
  app.add_option("--tensors", options.tensors,
                 "only tensors whose key matches this glob (* ? [..]), whole name, e.g. "
                 "'*.layers.0.*'");
  bool follow_symlinks = false;
  app.add_flag("--follow-symlinks", follow_symlinks,
               "read checkpoint files that are symlinks pointing outside the checkpoint "
               "directory (refused by default)");
  bool no_direct_io = false;
  fc::cli::AddNoDirectIoFlag(app, &no_direct_io);
  app.add_flag("--json", options.json, "machine-readable JSON on stdout");
  app.add_flag("--verify", options.verify,
               "check every element is stored exactly once (replicas aside), chunks lie "
               "inside their tensors, byte ranges inside their files, checksums match");
  app.add_option("--aoa", options.aoa_file,
                 "AOA program (line form or {\"aoa_statements\": [...]} JSON): print the "
                 "expanded statements and the resulting tensors, reading no tensor bytes");
  std::vector<std::string> families(fc::aoa::HfFamilyNames().begin(), fc::aoa::HfFamilyNames().end());
  app.add_option("--hf-family", options.hf_family,
                 "preview (or with --print-aoa print) the AOA program fc-export --hf-family "
                 "generates: Megatron-Core GPT -> HuggingFace names (llama: Llama 2/3, Mistral; "
                 "qwen2: Qwen2, QKV bias; gpt2: GPT-2; mixtral: Mixtral MoE; qwen2-moe: Qwen2-MoE)")
      ->check(CLI::IsMember(families))
      ->excludes("--aoa");
  app.add_option("--copy-from", options.hf_config_dir,
                 "with --hf-family: the HuggingFace model directory whose config.json the "
                 "program is made for (as fc-export --copy-from)");
  app.add_option("--from-hf-family", options.from_hf_family,
                 "CKPT is a HuggingFace model directory: preview (or with --print-aoa print) the "
                 "AOA program fc-convert --from-hf-family generates, HuggingFace -> Megatron-Core "
                 "GPT names and fused layouts (same families as --hf-family)")
      ->check(CLI::IsMember(families))
      ->excludes("--aoa")
      ->excludes("--hf-family");
  app.add_option("--target-like", options.target_like,
                 "with --from-hf-family: the Megatron checkpoint the program is made for (its "
                 "vocabulary padding, norm names, key form), as fc-convert --target-like");
  app.add_flag("--print-aoa", options.print_aoa,
               "with --hf-family or --from-hf-family: print the generated program");
  app.set_version_flag("--version", std::string("fc-inspect ") + FC_VERSION);
  app.footer(std::string(
                 "Examples:\n"
                 "  fc-inspect ckpt/                           # formats, tensors, shardings, sizes\n"
                 "  fc-inspect ckpt/ --json > ckpt.json\n"
                 "  fc-inspect ckpt/ --verify                  # read every byte, check checksums\n"
                 "  fc-inspect megatron/ --aoa to_hf.aoa       # the names and shapes a program gives\n"
                 "  fc-inspect megatron/ --hf-family llama --copy-from hf_model/ --print-aoa\n"
                 "  fc-inspect hf_model/ --from-hf-family llama --target-like step0/ --print-aoa\n\n") +
             fc::cli::ExitCodeHelp());
  const std::string tool = "fc-inspect";
  if (int code = fc::cli::ParseCommandLine(app, tool, argc, argv); code >= 0) return code;
  // --aoa previews the program's outputs; the tensor table and the verification are not
  // printed then, so the flags that shape them would do nothing.
  if (!options.hf_config_dir.empty() && options.hf_family.empty()) {
    return fc::cli::UsageError(tool, "--copy-from needs --hf-family");
  }
  if (!options.target_like.empty() && options.from_hf_family.empty()) {
    return fc::cli::UsageError(tool, "--target-like needs --from-hf-family");
  }
  if (options.print_aoa && options.hf_family.empty() && options.from_hf_family.empty()) {
    return fc::cli::UsageError(tool, "--print-aoa needs --hf-family or --from-hf-family");
  }
  if ((!options.hf_family.empty() || !options.from_hf_family.empty()) &&
      (app.count("--tensors") || options.verify)) {
    return fc::cli::UsageError(tool, std::string(options.verify ? "--verify" : "--tensors") +
                                         " cannot be combined with " +
                                         (options.hf_family.empty() ? "--from-hf-family"
                                                                    : "--hf-family"));
  }
  if (!options.aoa_file.empty() && (app.count("--tensors") || options.verify)) {
    return fc::cli::UsageError(tool, std::string(options.verify ? "--verify" : "--tensors") +
                                         " cannot be combined with --aoa (the AOA preview "
                                         "lists the program's outputs only)");
  }
  fc::cli::SetUpLogging("fc-inspect", false, false);
  fc::cli::SetUpIo(follow_symlinks, !no_direct_io);
  if (!format.empty()) {
    auto parsed = fc::ParseCheckpointFormat(format);
    if (!parsed.ok()) return fc::cli::Finish("fc-inspect", parsed.status());
    options.format = *parsed;
  }
  if (!source_layout.empty()) {
    auto split = fc::cli::LoadSourceLayout(source_layout);
    if (!split.ok()) return fc::cli::Finish("fc-inspect", split.status());
    options.source_split = *std::move(split);
  }
  fc::Status status = fc::RunInspect(options, std::cout);
  std::cout.flush();
  return fc::cli::Finish("fc-inspect", status);
}
