// Megatron's rank directories: an iteration dir (iter_NNNNNNN or release, found from a save
// dir through latest_checkpointed_iteration.txt) holds one dir per model-parallel rank,
// "mp_rank_TT[_PPP][_EEE]" (get_checkpoint_name: TP rank, then the pipeline stage and the
// expert-parallel rank when those degrees are above 1), each with its model_optim_rng.pt
// and, with the distributed optimizer, distrib_optim.pt. This names them, lists them and
// arranges them into the TP x PP x EP grid.
#ifndef FC_SRC_FORMAT_MEGATRON_RANK_GRID_H_
#define FC_SRC_FORMAT_MEGATRON_RANK_GRID_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "fc/core/status.h"

namespace fc::megatron_internal {

constexpr std::string_view kLatestFile = "latest_checkpointed_iteration.txt";
constexpr std::string_view kRankFile = "model_optim_rng.pt";
constexpr std::string_view kDistribOptimFile = "distrib_optim.pt";

struct Degrees {
  int64_t tp = 1, pp = 1, ep = 1;
};

// "mp_rank_TT[_PPP][_EEE]" -> its numbers (1 to 3), or empty when the name is another one.
std::vector<int64_t> RankNumbers(std::string_view n);

// Whether `dir` holds a rank dir with its model_optim_rng.pt (an iteration dir).
bool HasRankDirs(const std::string& dir);

// The dir named by <save>/latest_checkpointed_iteration.txt ("release" or a number), if
// that file exists.
Result<std::optional<std::string>> LatestIterationDir(const std::string& save);

// "mp_rank_TT": the rank dir name of TP rank `t` alone (two digits at least).
std::string TpRankName(int64_t t);

// A rank dir of an iteration dir and the numbers of its name.
struct RankDir {
  std::string name;
  std::vector<int64_t> numbers;
};

// The rank dirs of `dir`, sorted by name. kDataLoss when two name different numbers of
// parallel ranks; kNotFound when there is none.
Result<std::vector<RankDir>> ListRankDirs(const std::string& dir);

// The grid the rank dirs make.
struct RankGrid {
  size_t numbers = 0;         // per name: 1 (TP), 2 (TP and PP, or TP and EP), 3 (TP, PP, EP)
  bool second_is_ep = false;  // with 2 numbers: the second is the EP rank
  Degrees deg;                // one more than the highest rank number of each
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> by_rank;  // (t, p, e) -> dir

  // The name of rank (t, p, e) in this grid, as Megatron's get_checkpoint_name spells it.
  std::string DirName(int64_t t, int64_t p, int64_t e) const;
};

// Arranges `dirs` (ListRankDirs) into a grid; `second_is_ep` says what a second number means
// (the first rank's args decide). kDataLoss for a rank number out of range.
Result<RankGrid> ArrangeRankGrid(const std::string& dir, const std::vector<RankDir>& dirs,
                                 bool second_is_ep);

// Every rank of the full grid has its model_optim_rng.pt; kNotFound names the first missing.
Status CheckFullGrid(const std::string& dir, const RankGrid& grid);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_RANK_GRID_H_
