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
  // Creates every file (and its directories) under `dir`. Errors: kUnimplemented for a
  // dict entry whose value fc cannot pickle (bytes, sets, big ints, tensors); kIoError.
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
  std::string dir_;
  std::vector<std::unique_ptr<FileState>> files_;
};

// A torch.save archive (data.pkl, byteorder, version) of a value without tensors.
// Errors: kUnimplemented naming the first value fc does not pickle (tensors, bytes, sets,
// big ints, NEWOBJ_EX keyword arguments).
Result<std::string> PlainValueArchive(const PickleValue& value);
// True when the value holds a persistent id (a tensor or storage) anywhere.
bool HoldsTensor(const PickleValue& value);
// A plain int / bool node (for dict entries fc computes).
PickleValue::Ptr PickleInt(int64_t v);
PickleValue::Ptr PickleBool(bool v);

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
};

// Reads the non-tensor part of a UCP from the DeepSpeed checkpoint `input` (save dir, tag
// dir or UCP dir, resolved as ReadDeepSpeedCheckpoint does) for `params` (the trainable
// params written). `index` is its index (fc/format/deepspeed.h attributes). Stage <= 2:
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
