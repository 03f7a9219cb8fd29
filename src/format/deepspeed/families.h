// The index's tensors while a DeepSpeed checkpoint is read: one Builder per family (fp32
// weights, frozen, buffers, other module tensors, module.*, exp_avg, exp_avg_sq, step), the
// chunks located tensors contribute (whole, or a flattened range of a flat partition), and
// the union of pipeline stages' families.
#ifndef FC_SRC_FORMAT_DEEPSPEED_FAMILIES_H_
#define FC_SRC_FORMAT_DEEPSPEED_FAMILIES_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/flat_range.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "src/format/deepspeed/pt_file.h"

namespace fc::deepspeed_internal {

class Builder {
 public:
  // Adds a chunk to tensor `key`, creating it; dtype and shape must agree (else kDataLoss
  // naming `where`).
  Status Add(const std::string& key, DType dtype, const Shape& shape, Chunk chunk,
             const std::string& where);
  bool Has(const std::string& key) const { return pos_.count(key) > 0; }
  const TensorEntry* Get(const std::string& key) const {
    auto it = pos_.find(key);
    return it == pos_.end() ? nullptr : &tensors_[it->second];
  }
  // A copy of `from` named `key`, unless `key` exists.
  void AddCopy(const std::string& key, const TensorEntry& from);
  // The tensors in the order they were created; the builder is empty after.
  std::vector<TensorEntry> Take();

 private:
  std::map<std::string, size_t> pos_;
  std::vector<TensorEntry> tensors_;
};

// The whole tensor `l` of file `file` as one chunk (strided when `l` is not contiguous).
Chunk WholeChunk(const Located& l, uint32_t file);

// Elements [element_offset, element_offset + range.size()) of the 1-D tensor `l` hold the
// flattened range `range` of a tensor of `shape`. Errors: kDataLoss when `l` is not 1-D or
// the elements pass its end, kUnimplemented for a strided `l`; `what` names it.
Result<Chunk> FlatChunk(const Located& l, uint32_t file, const Shape& shape, FlatRange range,
                        int64_t element_offset, const std::string& what);

// The index's tensor families, in the order the index lists them.
enum Family { kWeights, kFrozen, kBuffers, kOther, kModule, kExpAvg, kExpAvgSq, kStep, kFamilies };
// The key prefix of each family; the rest of the key is the param's name in the model.
inline constexpr std::string_view kFamilyPrefix[kFamilies] = {
    "", "", "", "", "module.", "optimizer.exp_avg.", "optimizer.exp_avg_sq.", "optimizer.step."};

struct Families {
  std::array<std::vector<TensorEntry>, kFamilies> tensors;
  std::map<std::string, std::string> aliases;  // shared_params: alias -> owner
};

// Pipeline stages hold disjoint layers, except tied modules (DeepSpeed's
// pipeline_replicated_parameter_patterns), which every stage using them trains and saves:
// the first stage's copy is kept, as ds_to_universal does. Errors: kDataLoss when a stage's
// copy differs in dtype or shape (`where` names the stage).
Status UnionStage(Families&& from, const std::string& where, Families* into);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_FAMILIES_H_
