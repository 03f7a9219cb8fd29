// Megatron's rank directories (rank_grid.h).
#include "src/format/megatron/rank_grid.h"

#include <algorithm>

#include "fc/core/trim.h"
#include "fc/format/file_names.h"
#include "fc/io/file.h"
#include "src/format/megatron/param_names.h"

namespace fc::megatron_internal {
namespace {

// `v` in decimal, zero-padded to `width` digits.
std::string Padded(int64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

}  // namespace

std::vector<int64_t> RankNumbers(std::string_view n) {
  for (std::string_view pattern : {"mp_rank_#", "mp_rank_#_#", "mp_rank_#_#_#"}) {
    std::optional<NumberedName> m = MatchNumberedName(n, pattern);
    if (!m) continue;
    std::vector<int64_t> out;
    for (size_t i = 0; i < m->count; ++i) {
      if ((*m)[i] >= 1'000'000'000'000) return {};  // as ParseUint: 12 digits at most
      out.push_back(static_cast<int64_t>((*m)[i]));
    }
    return out;
  }
  return {};
}

bool HasRankDirs(const std::string& dir) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return false;
  for (const std::string& n : *names) {
    if (!RankNumbers(n).empty() && PathExists(dir + "/" + n + "/" + std::string(kRankFile))) {
      return true;
    }
  }
  return false;
}

Result<std::optional<std::string>> LatestIterationDir(const std::string& save) {
  const std::string latest = save + "/" + std::string(kLatestFile);
  if (!PathExists(latest) || IsDirectory(latest)) return std::optional<std::string>();
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
  const std::string text(
      TrimLineText(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  if (text == "release") return std::optional<std::string>("release");
  int64_t iteration = 0;
  if (!ParseUint(text, &iteration)) {
    return DataLossError(latest + ": '" + text.substr(0, 64) +
                         "' is neither an iteration number nor \"release\"");
  }
  std::string digits = std::to_string(iteration);
  if (digits.size() < 7) digits.insert(0, 7 - digits.size(), '0');
  return std::optional<std::string>("iter_" + digits);
}

std::string TpRankName(int64_t t) { return "mp_rank_" + Padded(t, 2); }

Result<std::vector<RankDir>> ListRankDirs(const std::string& dir) {
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::sort(names.begin(), names.end());
  std::vector<RankDir> dirs;
  for (const std::string& n : names) {
    std::vector<int64_t> nums = RankNumbers(n);
    if (nums.empty() || !IsDirectory(dir + "/" + n)) continue;
    if (!dirs.empty() && dirs[0].numbers.size() != nums.size()) {
      return DataLossError(dir + ": rank dirs " + dirs[0].name + " and " + n +
                           " name different numbers of parallel ranks");
    }
    dirs.push_back(RankDir{n, std::move(nums)});
  }
  if (dirs.empty()) return NotFoundError(dir + ": no mp_rank_* directories");
  return dirs;
}

std::string RankGrid::DirName(int64_t t, int64_t p, int64_t e) const {
  const size_t k = numbers;
  std::string n = TpRankName(t);
  if (k == 3 || (k == 2 && !second_is_ep)) n += "_" + Padded(p, 3);
  if (k == 3 || (k == 2 && second_is_ep)) n += "_" + Padded(e, 3);
  return n;
}

Result<RankGrid> ArrangeRankGrid(const std::string& dir, const std::vector<RankDir>& dirs,
                                 bool second_is_ep) {
  RankGrid grid;
  grid.numbers = dirs.empty() ? 0 : dirs[0].numbers.size();
  grid.second_is_ep = second_is_ep;
  const size_t k = grid.numbers;
  Degrees& deg = grid.deg;
  for (const auto& [n, nums] : dirs) {
    const int64_t t = nums[0];
    const int64_t p = k == 3 || (k == 2 && !second_is_ep) ? nums[1] : 0;
    const int64_t e = k == 3 ? nums[2] : (k == 2 && second_is_ep ? nums[1] : 0);
    if (t >= 100000 || p >= 100000 || e >= 100000) {
      return DataLossError(dir + "/" + n + ": rank number out of range");
    }
    deg.tp = std::max(deg.tp, t + 1);
    deg.pp = std::max(deg.pp, p + 1);
    deg.ep = std::max(deg.ep, e + 1);
    grid.by_rank[{t, p, e}] = n;
  }
  return grid;
}

Status CheckFullGrid(const std::string& dir, const RankGrid& grid) {
  const Degrees& deg = grid.deg;
  for (int64_t p = 0; p < deg.pp; ++p) {
    for (int64_t e = 0; e < deg.ep; ++e) {
      for (int64_t t = 0; t < deg.tp; ++t) {
        auto it = grid.by_rank.find({t, p, e});
        const std::string n = it == grid.by_rank.end() ? grid.DirName(t, p, e) : it->second;
        const std::string rel = n + "/" + std::string(kRankFile);
        if (!PathExists(dir + "/" + rel)) {
          return NotFoundError(dir + "/" + rel + ": missing (the rank dirs present make a TP " +
                               std::to_string(deg.tp) + " x PP " + std::to_string(deg.pp) +
                               " x EP " + std::to_string(deg.ep) + " grid)");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace fc::megatron_internal
