// What the AOA engine knows about a tensor (no bytes), and how optimizer-state keys relate
// to parameter keys.
//
// AOA statements name model (parameter) keys only. A checkpoint also holds optimizer states
// stored under the parameter key plus a suffix ("w.exp_avg", "w.moment1_0", ...); those
// follow their parameter's mapping (engine.h). Two kinds of suffix are configurable:
//   - state suffixes: the state has the parameter's shape and is mapped slice by slice;
//   - scalar suffixes (Paddle's beta pow accumulators): one value per parameter, copied whole
//     from one of the parameter's sources.
//
// Thread-safety: values; TensorDirectory is immutable after construction.
#ifndef FC_AOA_TENSOR_META_H_
#define FC_AOA_TENSOR_META_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"

namespace fc::aoa {

struct TensorMeta {
  std::string key;
  // Sources must set it. Destination tensors may leave it unset: then no dtype check is made
  // and the output dtype is whatever the statements produce.
  std::optional<DType> dtype;
  Shape shape;  // global shape
  // The stored pieces (global boxes). Only their global offsets are used: the fused macros
  // count shards (tensor-parallel degree) as distinct offsets along the fused axis. Empty
  // means one whole chunk.
  std::vector<Box> chunks;
};

struct StateSuffixes {
  // Longest match wins, so ".exp_avg_sq" is never read as ".exp_avg" + "_sq".
  std::vector<std::string> suffixes = {".exp_avg",   ".exp_avg_sq", ".fp32_param",
                                       ".moment1_0", ".moment2_0",  ".w_0"};
  std::vector<std::string> scalar_suffixes = {".beta1_pow_acc_0", ".beta2_pow_acc_0"};
};

// A key split into its parameter key and optimizer suffix ("" for a parameter).
struct SplitKey {
  std::string_view model_key;
  std::string_view suffix;
  bool scalar = false;  // suffix is one of the scalar suffixes
};

// Splits `key` by the longest matching suffix that leaves a non-empty model key.
SplitKey SplitStateSuffix(std::string_view key, const StateSuffixes& suffixes);

// An index over one side's tensors (the source checkpoint, or the destination layout).
// Holds pointers into the span given to the constructor, which must outlive it.
class TensorDirectory {
 public:
  TensorDirectory(std::span<const TensorMeta> tensors, const StateSuffixes& suffixes);

  // Exact key lookup (suffixes included); nullptr when absent.
  const TensorMeta* Find(std::string_view key) const;
  // Model keys (suffixes stripped, scalar-suffix keys included under their parameter),
  // sorted and unique.
  const std::vector<std::string>& model_keys() const { return model_keys_; }
  bool HasModelKey(std::string_view model_key) const;
  // The tensor that describes `model_key`: the key itself when stored, else its first state
  // (in suffix-list order); nullptr when neither exists.
  const TensorMeta* FindModel(std::string_view model_key) const;
  const StateSuffixes& suffixes() const { return suffixes_; }
  std::span<const TensorMeta> tensors() const { return tensors_; }

 private:
  std::span<const TensorMeta> tensors_;
  StateSuffixes suffixes_;
  std::unordered_map<std::string_view, const TensorMeta*> by_key_;
  std::vector<std::string> model_keys_;
};

}  // namespace fc::aoa

#endif  // FC_AOA_TENSOR_META_H_
