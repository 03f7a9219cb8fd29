// The DeepSpeed checkpoint reader (ReadDeepSpeedCheckpoint): its state while one checkpoint
// is read, and the steps, each defined in the file of its concept (rank.cc, zero12.cc,
// zero3.cc, moe.cc, pipeline.cc, tp_merge.cc, universal.cc, reader.cc).
#ifndef FC_SRC_FORMAT_DEEPSPEED_READER_H_
#define FC_SRC_FORMAT_DEEPSPEED_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/deepspeed.h"
#include "fc/model/checkpoint_index.h"
#include "src/format/deepspeed/families.h"
#include "src/format/deepspeed/pt_file.h"
#include "src/format/deepspeed/replica_compare.h"
#include "src/format/deepspeed/state_values.h"
#include "src/format/deepspeed/tp_rules.h"

namespace fc::deepspeed_internal {

// The files of one model-parallel rank.
struct RankFiles {
  PtFile* model = nullptr;               // mp_rank_XX_model_states.pt (stage <= 2)
  std::map<int64_t, PtFile*> optim;      // dp -> optim file
  std::map<int64_t, PtFile*> model_z3;   // dp -> zero_pp_rank model file (stage 3)
};

class Reader {
 public:
  explicit Reader(DeepSpeedReadOptions options) : options_(std::move(options)) {}
  Result<CheckpointIndex> Read(const std::string& path);

 private:
  // The tag dir's files, opened, by role.
  struct DirFiles {
    std::map<int64_t, RankFiles> ranks;                                        // mp rank ->
    std::map<int64_t, std::vector<std::pair<int64_t, const PtFile*>>> layers;  // TP rank ->
    std::map<int64_t, std::vector<const PtFile*>> experts;                     // mp rank ->
    bool moe = false;           // expert files present
    int64_t skipped_optim = 0;  // optimizer files not read (MoE)
  };
  struct Degrees {
    int64_t tp = 1, pp = 1;
    const PtFile* first_model = nullptr;  // mp rank 0's model states
  };
  // What reading the ranks gathers.
  struct RanksRead {
    std::vector<Families> per_tp;                     // per TP rank, stages united
    std::vector<std::set<std::string>> buffer_names;  // per TP rank
    ParamList order;                                  // UCP: params in param_shapes order
    std::set<std::string> ordered;                    // the names in `order`
    bool ucp_info = false;                            // universal_checkpoint_info saved
  };

  // The steps of Read, in order (reader.cc; PrepareMoe: moe.cc).
  // Lists dir_ and opens every file DeepSpeed wrote, by role; sets moe_ and pipeline_.
  Status OpenDirFiles(DirFiles* files);
  // TP and PP degrees (deepspeed.md section 1), checked against the files.
  Result<Degrees> FindDegrees(const DirFiles& files);
  Status ReadUniversalOptimizerState();
  Status PrepareMoe(DirFiles& files, const PtFile* first_model);
  // Every rank's files into families per TP rank, then the pipeline layer files.
  Status ReadRanks(DirFiles& files, int64_t tp, RanksRead* out);
  // UCP: the zero/<param>/ files into `all` (universal.cc).
  Status AddUniversalParams(const ParamList& order, int64_t tp, Families* all);
  void SetIndexAttributes(const std::string& tag, const Degrees& deg, bool ucp_info, bool rules);
  // Last: every opened file's root and storage places moved into the index's `retained`
  // (parsed_files.h), for the DeepSpeed writers.
  void RetainParsedFiles();

  Status ReadRank(int64_t mp, RankFiles& rf);
  Status ReadZero12(const PtFile& model, const std::vector<const PtFile*>& optims,
                    const std::vector<const PV*>& osds, bool bf16_optimizer);
  Status ReadZero3(const std::vector<const PtFile*>& models,
                   const std::vector<const PtFile*>& optims, const std::vector<const PV*>& osds);
  Status ReadMoeZero12(const std::vector<const PtFile*>& optims,
                       const std::vector<const PV*>& osds, bool bf16_optimizer);
  // One expert-parallel rank's partitions of a MoE param group (moe.cc).
  struct MoeGroupPart {
    size_t g, ngroups;   // the group, of so many
    int64_t count, ep;   // partitions of the group, expert-parallel ranks
    int64_t e;           // the expert-parallel rank
    bool expert_group, data_before_expert;
  };
  Status ReadMoeGroupPart(const std::vector<const PtFile*>& optims,
                          const std::vector<const PV*>& osds, const MoeGroupPart& part,
                          bool bf16_optimizer);
  Status AddFrozenFull(const PtFile& model);
  Status AddFrozenZero3(const std::vector<const PtFile*>& models);
  Status AddModule(const PtFile& model, bool zero3_placeholders);
  Status AddExpertFiles(const std::vector<const PtFile*>& files);
  Status AddStep(const PtFile& f, const PV* state, int64_t g, const ParamList& params);
  // A param's flattened range `range` read from a flat partition of file f: the fp32 master
  // (`fp32`) and, when located, exp_avg and exp_avg_sq, the range starting at element
  // `element_offset` of each.
  Status AddFlatParam(const PtFile& f, const Located& fp32, const Located* exp_avg,
                      const Located* exp_avg_sq, const std::string& name, const Shape& shape,
                      FlatRange range, int64_t element_offset);
  void SetAttr(const std::string& k, const std::string& v, const std::string& where);

  Families TakeFamilies();
  Status AddLayerFiles(const std::vector<std::pair<int64_t, const PtFile*>>& layers,
                       const std::set<std::string>& buffer_names,
                       const std::set<std::string>& known_params, Families* f);
  // TP > 1 (tp_merge.cc): the TP ranks' families merged by the user's --source-layout,
  // else by `rules` (universal_checkpoint_info), else kept per rank (mp_rank_YY.<key>).
  Result<Families> MergeTp(std::vector<Families> per_tp, const TpRules* rules);
  // Module buffers that no rule splits: name -> "" when their TP copies are equal, else why
  // they stay per rank (deepspeed.tp_buffers_per_rank).
  using BufferVerdicts = std::map<std::string, std::string>;
  // One buffer's TP copies `parts` (family i) into `out`: one tensor (TP rank 0's) when
  // equal, else one per rank, <family prefix>mp_rank_YY.<name>.
  Status AddBufferCopies(size_t i, const std::string& name,
                         const std::vector<TensorEntry*>& parts, ChunkReader& reader,
                         BufferVerdicts* verdicts, Families* out) const;
  Result<Families> MergeTpBySourceLayout(std::vector<Families>& per_tp, ChunkReader& reader,
                                         BufferVerdicts* buffer_verdicts) const;
  Result<Families> MergeTpByRules(std::vector<Families>& per_tp, const TpRules& rules,
                                  ChunkReader& reader, BufferVerdicts* buffer_verdicts);
  // One tensor of family i (not a buffer kept by the buffer rule): its TP slices `parts`
  // merged by the rule matching `name` into `out`, or kept per rank and listed in *unmerged.
  Status MergeByRules(size_t i, const std::string& name, const std::vector<TensorEntry*>& parts,
                      const TpRules& rules, ChunkReader& reader, std::set<std::string>* unmerged,
                      Families* out) const;
  Status ReadUniversalParams(const std::vector<std::pair<std::string, Shape>>& order,
                             bool check_shapes, Families* f);
  // Opens dir_/rel as the index's next file.
  Result<PtFile*> Open(const std::string& rel);

  // Module buffers at TP > 1 (MergeTp): "" when the TP copies `parts` are equal (dtype,
  // shape, values), else why they are kept per rank.
  Result<std::string> BufferCopiesDiffer(const std::vector<TensorEntry*>& parts,
                                         ChunkReader& reader) const;
  // The kDataLoss refusal of a replicated tensor `key` whose copies differ (`rule` says
  // what made it replicated).
  Status ReplicasDiffer(const std::string& key, const std::vector<TensorEntry*>& parts,
                        const ReplicaDifference& d, const std::string& rule) const;
  // The file holding element `element` of `e` (for messages).
  std::string FileOfElement(const TensorEntry& e, int64_t element) const;

  // The user's TP rules (--source-layout) merge `parts` (one per TP rank) into `m`.
  Status MergeBySourceSplit(const std::string& name, bool step,
                            const std::vector<TensorEntry*>& parts, TensorEntry* m,
                            ChunkReader& reader) const;

  DeepSpeedReadOptions options_;
  bool pipeline_ = false;   // layer_* files hold the module weights
  bool universal_ = false;  // a Universal Checkpoint (zero/<param>/*.pt)
  bool moe_ = false;        // MoE expert files: the ZeRO files are read by ReadMoeZero12
  // MoE: every module and expert tensor's shape (the model states carry no param_shapes),
  // and per expert module (the name up to "deepspeed_experts.") its number of experts.
  std::map<std::string, Shape> moe_shapes_;
  std::map<std::string, int64_t> moe_experts_;
  bool moe_optimizer_read_ = false;
  std::vector<std::unique_ptr<PtFile>> files_;
  Builder weights_, frozen_, buffers_, other_, module_, exp_avg_, exp_avg_sq_, step_;
  std::map<std::string, std::string> aliases_;  // alias -> owner (prefixed)
  std::string module_dtype_, master_dtype_;
  CheckpointIndex index_;
  std::string dir_;
};

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_READER_H_
