// The partition math of the DeepSpeed writer (fc/format/deepspeed_writer.h;
// shared/reference/deepspeed.md 3.1 and 4.1): where a flat buffer is cut at a DP size, and a
// new partition as element ranges of the old ones plus zeros. Repartitioner also registers the
// source tensors those ranges read in the plan's index. Pure.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_PARTITION_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/dtype.h"
#include "fc/format/deepspeed_writer.h"
#include "src/format/deepspeed/ds_source_file.h"

namespace fc::deepspeed_writer_internal {

// Stage 1/2 (deepspeed.md 3.1): a group's flat buffer padded to a multiple of 2 * dp.
int64_t PaddedLength(int64_t orig, int64_t dp);

// Real (non-padding) elements of rank r's partition.
int64_t LeanLength(int64_t orig, int64_t ps, int64_t r);

struct GroupSource {
  int64_t orig = 0;                        // real elements of the flat buffer
  std::vector<std::pair<std::string, int64_t>> params;  // param_shapes order: name, numel
  PickleValue::Ptr storage_class;          // the fp32 partition's torch.<X>Storage global
  PickleValue::Ptr state_storage_class;    // exp_avg's
  DType dtype = DType::kFloat32;           // master dtype
  DType state_dtype = DType::kFloat32;
  // Source tensor index per (old rank) for fp32, exp_avg, exp_avg_sq (lean parts).
  std::vector<int64_t> fp32, exp_avg, exp_avg_sq;
};

class Repartitioner {
 public:
  explicit Repartitioner(DsRepartition& job) : job_(job) {}

  // Adds a source tensor: the first `elements` of a located 1-D tensor.
  int64_t AddSource(const std::string& key, const SourceFile& sf, const Located& l,
                    int64_t elements);

  // Adds sf to the source's file list and sets sf.index.
  uint32_t AddFile(SourceFile& sf);

  // The record of new rank r's partition of one state of a group: `storage` elements
  // (the padded partition) from the old ranks' lean parts, zeros after the real ones.
  DsRecord Partition(const GroupSource& g, const std::vector<int64_t>& sources, DType dtype,
                     int64_t r, const std::string& name) const;

  // The same for a group cut over `old_count` partitions before and `new_count` after
  // (MoE expert groups: the expert-data-parallel sizes); r is the new partition.
  static DsRecord PartitionOver(const GroupSource& g, const std::vector<int64_t>& sources,
                                DType dtype, int64_t old_count, int64_t new_count, int64_t r,
                                const std::string& name);

 private:
  DsRepartition& job_;
};

// param_slice_mappings[g] of new rank r: OrderedDict name -> fragment_address(numel, start).
PickleValue::Ptr SliceMappings(const GroupSource& g, int64_t ps, int64_t r,
                               const PickleValue::Ptr& fragment_cls);

// ZeRO-3 (deepspeed.md 4.1): every param is split on its own, ceil(numel / dp) elements per
// rank with the padding at the tail; a sub-group's flat tensor is its params' slices
// concatenated. A new slice is a few ranges of old slices plus zeros.
struct Zero3Param {
  std::string name;
  int64_t numel = 0;
};

int64_t CeilDiv(int64_t a, int64_t b);

// Appends to `rec` the parts of param `p` of new rank r: its new slice at `dst_at`, from the
// old ranks' slices at `src_at[o]` of sources[o].
void AddZero3Parts(DsRecord& rec, int64_t numel, int64_t old_dp, int64_t new_dp, int64_t r,
                   const std::vector<int64_t>& sources, const std::vector<int64_t>& src_at,
                   int64_t dst_at);

// DeepSpeed's _create_fp16_sub_groups for one param group: the param counts of its
// sub-groups (params taken in order until their slices reach sub_group_size).
std::vector<size_t> SubGroupSplit(const std::vector<int64_t>& numels, int64_t dp, double size);

// A stream record of `elements` elements of dtype, no parts yet.
DsRecord StreamRecord(DType dtype, int64_t elements, std::string name);

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_PARTITION_H_
