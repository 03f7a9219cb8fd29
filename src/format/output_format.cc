#include "fc/format/output_format.h"

#include <array>

#include "src/format/output_entries.h"

namespace fc {

std::span<const OutputFormat> OutputFormats() {
  // The DeepSpeed shapes have no TargetFilesWriter: their writers take the DeepSpeed index
  // itself (the files' structure follows the input's, not a target layout).
  static const std::array<OutputFormat, 4> kFormats = {
      FcDistcpOutputFormat(),
      TorchDcpOutputFormat(),
      OutputFormat{.name = "ucp",
                   .summary = "a DeepSpeed Universal Checkpoint from a DeepSpeed checkpoint, "
                              "as ds_to_universal.py writes it, or from torch Adam states "
                              "(optim.state.<param>.exp_avg ...) in any format, or from a "
                              "Megatron checkpoint's optimizer states: "
                              "OUT/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, "
                              "zero/optimizer_state.pt, the model states (copied or written), then "
                              "<parent of OUT>/latest_universal; no target",
                   .shape = OutputShape::kDeepSpeedUniversal},
      OutputFormat{.name = "deepspeed",
                   .summary = "a DeepSpeed ZeRO-1/2/3 or BF16_Optimizer checkpoint "
                              "re-partitioned for --dp N: OUT/latest, "
                              "OUT/<tag>/mp_rank_XX_model_states.pt (ZeRO-3: one per rank) and "
                              "[bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt for R < N; no "
                              "target",
                   .shape = OutputShape::kDeepSpeedRepartitioned},
  };
  return kFormats;
}

std::string OutputFormatNames() {
  std::string names;
  for (const OutputFormat& f : OutputFormats()) {
    if (!names.empty()) names += ", ";
    names += f.name;
  }
  return names;
}

Result<const OutputFormat*> FindOutputFormat(std::string_view name) {
  for (const OutputFormat& f : OutputFormats()) {
    if (f.name == name) return &f;
  }
  return InvalidArgumentError("unknown output format '" + std::string(name) +
                              "' (expected one of: " + OutputFormatNames() + ")");
}

}  // namespace fc
