// Writing DeepSpeed Universal Checkpoints (what ds_to_universal.py writes; layout in
// shared/reference/deepspeed.md section 5), file by file, with the tensor bytes streamed in:
// every file's layout is fixed before any data exists, so the executor's slabs go straight
// to their final place, from any thread, in any order (as the torch DCP writer does).
//
// Files (relative to OUT):
//   zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt
//       torch.save zips (records archive/data.pkl, byteorder, data/0, version) of
//       UcpFileForm::kDict: a dict whose entries are `before`, then 'param' (the tensor),
//       then `after` (ds_to_universal's order: cat_dim, param_n_sub_params, vocab_tensor,
//       then param), protocol 2, strings memoized as CPython does; or kRawTensor: the tensor
//       alone (the stage-3 form: the flat 1-D fp32 param).
//   zero/<param>/step.pt   the step: a 0-d tensor (kRawTensor), or a Python int
//                          (PlainValueArchive).
// The archive's data/0 is the tensor in row-major order, little-endian; its CRC-32 is
// combined from the slabs' CRCs (nothing is read back).
//
// Also here: reading what a UCP needs besides tensors from a DeepSpeed source (ReadUcpSource):
// universal_checkpoint_info (the cat_dim / vocab_tensor / param_n_sub_params keys of 5.5),
// rank 0's optimizer state (-> zero/optimizer_state.pt, 5.3), the model-states files to copy;
// from a UCP source the same files and each param file's non-tensor keys.
//
// Thread-safety: UcpWriter::Write may be called concurrently for distinct byte ranges;
// Create and Finish from one thread.
#ifndef FC_FORMAT_UCP_WRITER_H_
#define FC_FORMAT_UCP_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/codec/pickle_build.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

enum class UcpFileForm { kDict, kRawTensor };

// A param file's non-tensor part.
struct UcpFileMeta {
  UcpFileForm form = UcpFileForm::kDict;
  std::vector<std::pair<std::string, PickleValue::Ptr>> before;  // dict entries before 'param'
  std::vector<std::pair<std::string, PickleValue::Ptr>> after;   // and after it
};

struct UcpFileSpec {
  std::string path;  // relative to the output directory, e.g. "zero/embed.weight/fp32.pt"
  DType dtype = DType::kFloat32;
  Shape shape;       // as stored (kRawTensor of a stage-3 param: {numel})
  UcpFileMeta meta;
};

class UcpWriter {
 public:
  // Creates every file (and its directories) under `dir`. Errors: kInvalidArgument for a
  // path that is absolute or has an empty, "." or ".." component (paths come from param
  // names in the source); kUnimplemented for a dict entry whose value fc cannot pickle
  // (bytes, sets, big ints, tensors); kIoError.
  static Result<std::unique_ptr<UcpWriter>> Create(const std::string& dir,
                                                   std::vector<UcpFileSpec> files);
  ~UcpWriter();
  UcpWriter(const UcpWriter&) = delete;
  UcpWriter& operator=(const UcpWriter&) = delete;

  // Tensor bytes [offset, offset + bytes.size()) of file `file`. Errors: kInvalidArgument
  // for bytes outside the tensor or written twice; kIoError.
  Status Write(size_t file, uint64_t offset, std::span<const std::byte> bytes);
  // Writes the headers and directories, checks every tensor byte was written
  // (kInternal otherwise), syncs and closes every file.
  Status Finish();

 private:
  struct FileState;
  UcpWriter() = default;
  static Status WriteTail(FileState& fs);
  std::string dir_;
  std::vector<std::unique_ptr<FileState>> files_;
};

// A torch.save archive (data.pkl, byteorder, version) of a value without tensors.
// Errors: kUnimplemented naming the first value fc does not pickle (tensors, bytes, sets,
// big ints, NEWOBJ_EX keyword arguments).
Result<std::string> PlainValueArchive(const PickleValue& value);
// True when the value holds a persistent id (a tensor or storage) anywhere.
bool HoldsTensor(const PickleValue& value);

// What a UCP written from a DeepSpeed checkpoint carries besides the tensors.
struct UcpSource {
  bool universal = false;           // the source is a UCP itself
  std::string dir;                  // tag dir / UCP dir that holds the model states
  // Files of `dir` copied byte for byte into OUT: every *model_states.pt but MoE expert
  // files (ds_to_universal copies mp_rank_XX_model_states.pt for stage <= 2; fc also copies
  // a pipeline's layer_LL-model_YY-model_states.pt, the only files holding its weights).
  std::vector<std::string> copy_files;
  // zero/optimizer_state.pt: a UCP source's file (copied), else the archive built by
  // ReadUcpSource (deepspeed.md 5.3).
  std::string optimizer_state_copy;  // path to copy; empty: write optimizer_state_archive
  std::string optimizer_state_archive;
  // Per "<param>/<state>" (state: fp32, exp_avg, exp_avg_sq): the file's non-tensor part.
  std::map<std::string, UcpFileMeta> meta;
  // A source that is not DeepSpeed's: the model states fc writes as model_states_name
  // (empty: none; copy_files are copied instead).
  std::string model_states_archive;
  std::string model_states_name;
};

// The DeepSpeed release a synthesized UCP names as its ds_version: 0.14.1, the first whose
// universal loader reads step.pt and the optimizer-state files found in each param folder
// (the ZeRO-1 loader also requires >= 0.3.17). DeepSpeed reads it only from
// zero/optimizer_state.pt.
inline constexpr const char* kSynthesizedDsVersion = "0.14.1";

// The non-tensor part of a UCP written from a checkpoint DeepSpeed did not write (torch DCP,
// fc distcp, ...), in the form DeepSpeed's universal loader reads for ZeRO 1/2 and
// BF16_Optimizer (`zero3` false) or ZeRO-3, one data-parallel and one model-parallel rank.
// ZeRO 1/2:
//   mp_rank_00_model_states.pt: {module: {} (not read in universal mode: weights come from
//     zero/), buffer_names: [], param_shapes: [OrderedDict(name -> torch.Size)] (`params`, in
//     order, one group), frozen_param_shapes: None, shared_params: {}, skipped_steps: 0,
//     global_steps: `step`, dp_world_size: 1, mp_world_size: 1, ds_version}; no
//     lr_scheduler (the source's schedule is not DeepSpeed's: load with
//     load_lr_scheduler_states=False).
//   zero/optimizer_state.pt: {ds_version, param_groups: []} (the hyperparameters come from
//     the DeepSpeed config).
//   each param file: {'cat_dim': 0, 'param': tensor} (ds_to_universal's form for a param
//     without merge rules); step.pt (written by the caller).
// ZeRO-3: the same model states as zero_pp_rank_0_mp_rank_00_model_states.pt (the one
//   DeepSpeed's stage-3 universal load opens); zero/optimizer_state.pt {ds_version,
//   optimizer_state_dict: {state: {0: {step: `step`}}, param_groups: [{}]}} (the stage-3
//   loader gives every sub-group that step and copies group 0's entries, none here, into
//   every live group); param files raw flat tensors, no step.pt.
// Errors: kUnimplemented if a value cannot be pickled (not expected).
Result<UcpSource> SynthesizedUcpSource(const std::vector<std::pair<std::string, Shape>>& params,
                                       int64_t step, bool zero3);

// Reads the non-tensor part of a UCP from the DeepSpeed checkpoint `input` (save dir, tag
// dir or UCP dir, resolved as ReadDeepSpeedCheckpoint does) for `params` (the trainable
// params written). `index` is its index (fc/format/deepspeed.h attributes); the .pt files
// its reader parsed (the model states, rank 0's optimizer file, a UCP's param files) are
// taken from it, not opened again; an index that kept none (built by hand) has them read
// here. Stage <= 2:
// dicts with cat_dim (1 for parameter_with_row_parallelism_patterns, else 0; absent for
// tp_replicated_parameter_patterns), param_n_sub_params 2
// (parameter_with_2_sub_params_cat_dim_0), sub_param_shape (parameter_with_sub_params: the
// SubparamShape object ds_to_universal saves, its shape as in universal_checkpoint_info, a
// pre-0.4 count of sub-params at partition_dim replaced by their sizes, no cat_dim) and
// vocab_tensor (vocabulary_parameter_patterns),
// or cat_dim 0 for every param without universal_checkpoint_info (ds_to_universal's
// --inject_missing_state); stage 3 with TP 1: raw 1-D tensors.
// Files in either torch.save serialization (zip or legacy) are read.
// Errors: kUnimplemented for optimizer-state values fc does not pickle; kDataLoss /
// kNotFound for unreadable files.
Result<UcpSource> ReadUcpSource(const std::string& input, const CheckpointIndex& index,
                                const std::vector<std::string>& params);

}  // namespace fc

#endif  // FC_FORMAT_UCP_WRITER_H_
