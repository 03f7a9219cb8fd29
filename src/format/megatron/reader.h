// The Megatron legacy reader (ReadMegatronLegacyCheckpoint): its state and its steps. Read
// runs them in order: find the rank grid (rank_grid.h) and open the first rank's file for
// args; check the degrees; open every rank file; check iteration and checkpoint_version;
// flatten each rank's model chunks; number the layers; read the optimizer states (the
// distributed optimizer's distrib_optim.pt: distrib_optim.cc; the Float16 and FP32
// optimizers' in model_optim_rng.pt: float16_optimizer.cc); give every tensor its global name
// and merge the TP ranks (tp_merge.cc); count the elements; set the attributes
// (attributes.cc). The steps share the members below.
#ifndef FC_SRC_FORMAT_MEGATRON_READER_H_
#define FC_SRC_FORMAT_MEGATRON_READER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fc/format/megatron.h"
#include "fc/model/checkpoint_index.h"
#include "src/format/megatron/distrib_optim_layout.h"
#include "src/format/megatron/param_names.h"
#include "src/format/megatron/pickle_values.h"
#include "src/format/megatron/rank_file.h"
#include "src/format/megatron/rank_grid.h"

namespace fc::megatron_internal {

class Reader {
 public:
  explicit Reader(MegatronReadOptions options) : options_(std::move(options)) {}
  Result<CheckpointIndex> Read(const std::string& path);

  using Grid = std::map<std::tuple<int64_t, int64_t, int64_t>, const RankFile*>;  // p, e, t
  // (p, e, t, v) -> the tensors of chunk v of rank (t, p, e)'s model.
  using Pieces = std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<Piece>>;

 private:
  // Tensors by global name, per TP rank, and the names in TP rank 0's order.
  struct TpTensors {
    std::vector<std::map<std::string, Located>> per_tp;
    std::vector<std::string> order;
  };

  // --- The steps of Read (reader.cc), in order ---
  Result<std::string> ResolveDir(const std::string& path);
  // ranks_, and files_[0] (the first rank's file) with args_.
  Status FindRankGrid();
  Status CheckDegrees() const;
  // Every rank file (grid order: stage, expert rank, TP rank): files_, grid_, distrib_optim_.
  Status OpenRankFiles();
  // iteration and checkpoint_version: the same in every file.
  Status CheckIterationAndVersion();
  // Model chunks: model, or model0..model{V-1} (virtual pipeline): vpp_, pieces_, skipped_.
  Status CollectModelChunks();
  // Layer offsets: chunk v of stage p follows chunks (v' < v, any stage) and (v, p' < p).
  Status CountLayers();
  // optim_, or optim_not_read_ saying why not (never an error of the checkpoint).
  void ReadOptimizerStates();
  // Global names of rank (t, p, e)'s chunk v: the first stage / EP rank 0 copy of a shared
  // tensor wins.
  Status NameRankTensors(int64_t v, int64_t p, int64_t e, int64_t t, TpTensors* model,
                         TpTensors* optim);
  // Every element of every tensor is covered exactly once by construction; count to be sure.
  Status CheckCoverage() const;

  // --- The attributes (attributes.cc) ---
  void AddModelAttributes();
  void AddOptimizerAttributes();
  void AddOptimizerStep();
  void AddOpaqueGlobals();

  std::optional<int64_t> ArgInt(const char* key) const {
    return args_ ? PickleInt(args_->Find(key)) : std::nullopt;
  }
  Status CheckDegree(const char* key, int64_t found, const std::string& what) const;
  std::string ModelKey(int64_t v) const {
    return virtual_pp_ ? "model" + std::to_string(v) : std::string("model");
  }

  // --- TP merge (tp_merge.cc) ---
  Status MergeTp(const std::vector<std::string>& order,
                 const std::vector<std::map<std::string, Located>>& per_tp,
                 std::optional<bool> swiglu);
  // The TP role of `name` with the given TP rank 0 shape: the built-in table, or the
  // caller's rules (options_.tp_axis).
  Result<RoleInfo> TpRole(const std::string& name, const Located& l0) const;

  // --- The distributed optimizer (distrib_optim.cc) ---
  // distrib_optim.pt of every rank: fills optim_. An error says why the states are not
  // read (the model weights never depend on them).
  Status ReadDistribOptim(const Grid& grid, const Pieces& pieces, const Degrees& deg,
                          int64_t vpp);
  Status ReadRankDistribOptim(const RankFile& model, const Pieces& pieces, int64_t p, int64_t e,
                              int64_t t, const Degrees& deg, int64_t vpp);
  // One optimizer's state (`state`, of file `f`) over the rank's dense or expert params:
  // of every model chunk, or (overlap_param_gather_with_optimizer_step: an optimizer per
  // chunk) of chunk `chunk` only.
  Status ReadOptimizerState(const RankFile& model, const RankFile& f, const PV& state,
                            const std::string& rel, bool experts, const Pieces& pieces,
                            int64_t p, int64_t e, int64_t t, const Degrees& deg, int64_t vpp,
                            std::optional<int64_t> chunk = std::nullopt);
  // The candidate layouts of model chunk v of stage p: what args say, both alignments.
  // `rank_numel`: the rank's parameter count (every chunk, dense and expert), which
  // args.ddp_num_buckets divides into the bucket size.
  Result<std::vector<BufferLayoutRule>> LayoutCandidates(int64_t p, int64_t v,
                                                         std::optional<int64_t> rank_numel) const;
  // The rank's parameter count when args.ddp_num_buckets needs it, else nullopt.
  Result<std::optional<int64_t>> RankNumel(const RankFile& model, const Pieces& pieces,
                                           int64_t p, int64_t e, int64_t t, int64_t vpp) const;

  // --- The Float16 and FP32 optimizers (float16_optimizer.cc) ---
  // The Float16 (non-distributed) optimizer's state in each model_optim_rng.pt: fills
  // optim_, or says why not.
  Status ReadFloat16Optimizer(const Grid& grid, const Pieces& pieces, int64_t vpp);
  // One optimizer's state dict `state` over the rank's params that `member` accepts;
  // records those `keep` accepts.
  Status ReadFloat16State(const RankFile& f, const PV& state, const std::string& rel,
                          const std::function<bool(const Piece&)>& member,
                          const std::function<bool(const Piece&)>& keep, const Pieces& pieces,
                          int64_t p, int64_t e, int64_t t, int64_t vpp);

  MegatronReadOptions options_;
  std::string dir_;
  CheckpointIndex index_;
  std::vector<std::unique_ptr<RankFile>> files_;
  const PV* args_ = nullptr;
  std::string args_file_;  // the first rank's model_optim_rng.pt, relative to dir_
  std::set<std::string> unmerged_;
  // (p, e, t, v, local name) -> the param's fp32 master weight, exp_avg, exp_avg_sq.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, std::string>, std::array<Located, 3>>
      optim_;
  std::set<std::string> optim_layouts_;  // the rules that matched, for the attribute
  std::set<std::string> frozen_;         // params no buffer holds (no optimizer state)

  // What the steps found, in the order they find it.
  RankGrid ranks_;
  Grid grid_;
  int64_t distrib_optim_ = 0;  // rank dirs with a distrib_optim.pt
  bool virtual_pp_ = false;
  int64_t vpp_ = 0;
  Pieces pieces_;
  int64_t skipped_ = 0;
  std::map<std::pair<int64_t, int64_t>, int64_t> layer_offset_;  // (v, p) -> first global layer
  int64_t layers_ = 0;
  std::optional<int64_t> num_experts_;
  const PV* opt_ = nullptr;   // the first rank's "optimizer"
  const PV* opt0_ = nullptr;  // its first optimizer (a ChainedOptimizer's list: item 0)
  bool float16_ = false;
  bool fp32_optimizer_ = false;
  std::string optim_not_read_;
  std::optional<bool> swiglu_;
};

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_READER_H_
