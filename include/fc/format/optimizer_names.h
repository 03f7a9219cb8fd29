// How each framework's writer names a param's optimizer (Adam) states, as facts next to the
// readers rather than switches in the operations: the keys a reader's index holds for them
// (fc/model/checkpoint_index.h), the markers that tell an optimizer key from a model key,
// and why a reader left a checkpoint's optimizer states unread.
//
// Thread-safety: pure functions and constants.
#ifndef FC_FORMAT_OPTIMIZER_NAMES_H_
#define FC_FORMAT_OPTIMIZER_NAMES_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fc/model/checkpoint_index.h"

namespace fc {

// One way a writer names a param's Adam states (the keys of a reader's index).
struct AdamNames {
  std::string_view writer;           // for messages
  std::string param, exp_avg_sq;
  std::string step;                  // empty: the writer keeps no step tensor
  std::vector<std::string> weights;  // the param's weight, first found wins
  size_t masters = 0;                // weights[0, masters) are fp32 masters the others round to
  // States the step stands for, carried by the step (PaddlePaddle's beta1^step and
  // beta2^step).
  std::vector<std::string> step_powers;
};

// The namings under which `key` is a param's exp_avg, in the order tried (the first whose
// exp_avg_sq exists is taken); empty when it is none. Writers: torch DCP's flattened
// {"model", "optim"} state dict (optim.state.<p>.exp_avg / optimizer.state.<p>.exp_avg,
// weight <p> / model.<p> / module.<p>), Megatron-Core torch_dist
// (optimizer.state.exp_avg.<p>, weight optimizer.state.fp32_param.<p> /
// optimizer.state.param.<p> / <p>, no step tensor), fc's DeepSpeed and Megatron legacy
// names (optimizer.exp_avg.<p>, weight optimizer.fp32.<p> / <p> / module.<p>),
// PaddlePaddle (<p>.moment1_0, weight <p>.w_0 / <p>, no step, beta powers).
std::vector<AdamNames> AdamNamesOf(std::string_view key);

// Substrings that mark a key as optimizer state in any format fc reads: "optim.",
// "optimizer.", ".exp_avg", ".exp_avg_sq", ".fp32_param", ".moment1_0", ".moment2_0",
// ".w_0", ".beta1_pow_acc_0", ".beta2_pow_acc_0", ".master_weight".
extern const std::vector<std::string> kDefaultOptimizerMarkers;

// Whether `key` holds one of `markers`.
bool IsOptimizerKey(const std::string& key, const std::vector<std::string>& markers);

// Why the reader of `index` left its optimizer states unread (Megatron legacy: the
// distributed optimizer's distrib_optim.pt, as megatron.distrib_optim or
// megatron.optimizer say); empty when they were read or the format says nothing.
std::string UnreadOptimizerStates(const CheckpointIndex& index);

}  // namespace fc

#endif  // FC_FORMAT_OPTIMIZER_NAMES_H_
