#include "fc/plan/slabs.h"

#include <algorithm>
#include <span>

#include "fc/core/flat_range.h"

namespace fc {

std::vector<Box> ContiguousSlabs(const Box& box, int64_t max_elements) {
  const Shape& shape = box.local_shape;
  const size_t rank = shape.size();
  if (rank == 0 || box.empty()) return {box};
  // The outermost axis k whose trailing block (axes after k) fits the budget.
  size_t k = 0;
  int64_t trailing = box.num_elements() / shape[0];
  while (k + 1 < rank && trailing > max_elements) {
    ++k;
    trailing /= shape[k];
  }
  const int64_t per_slab = std::max<int64_t>(1, max_elements / std::max<int64_t>(1, trailing));
  int64_t outer = 1;
  for (size_t i = 0; i < k; ++i) outer *= shape[i];
  std::vector<Box> slabs;
  for (int64_t o = 0; o < outer; ++o) {
    const Shape lead = k > 0 ? Unravel(o, std::span<const int64_t>(shape.data(), k)) : Shape{};
    for (int64_t start = 0; start < shape[k]; start += per_slab) {
      Box b = box;
      for (size_t i = 0; i < k; ++i) {
        b.global_offset[i] = box.global_offset[i] + lead[i];
        b.local_shape[i] = 1;
      }
      b.global_offset[k] = box.global_offset[k] + start;
      b.local_shape[k] = std::min(per_slab, shape[k] - start);
      slabs.push_back(std::move(b));
    }
  }
  return slabs;
}

std::vector<std::vector<size_t>> BalanceByBytes(const std::vector<uint64_t>& sizes, int parts) {
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  const size_t n = static_cast<size_t>(std::max(parts, 1));
  std::vector<std::vector<size_t>> assigned(n);
  std::vector<std::pair<uint64_t, size_t>> load(n);  // (bytes, items): empty items spread too
  for (size_t i : order) {
    const size_t to = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    assigned[to].push_back(i);
    load[to].first += sizes[i];
    ++load[to].second;
  }
  for (std::vector<size_t>& a : assigned) std::sort(a.begin(), a.end());
  return assigned;
}

}  // namespace fc
