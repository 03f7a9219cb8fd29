// KeyLookupCache. Contract: include/fc/model/key_lookup.h.
#include "fc/model/key_lookup.h"

#include <functional>
#include <unordered_map>

namespace fc {

struct KeyLookupCache::Snapshot {
  const void* data = nullptr;
  size_t size = 0;
  std::unordered_multimap<size_t, size_t> positions;  // hash(key) -> index; first index wins
};

size_t KeyLookupCache::FindIndexImpl(const void* data, size_t size, const void* ctx,
                                     KeyAt key_at, std::string_view key) const {
  const std::hash<std::string_view> hash;
  auto build = [&] {
    auto s = std::make_shared<Snapshot>();
    s->data = data;
    s->size = size;
    s->positions.reserve(size);
    for (size_t i = 0; i < size; ++i) s->positions.emplace(hash(key_at(ctx, i)), i);
    std::shared_ptr<const Snapshot> frozen = std::move(s);
    snapshot_.store(frozen);
    return frozen;
  };
  std::shared_ptr<const Snapshot> snap = snapshot_.load();
  if (!snap || snap->data != data || snap->size != size) snap = build();
  const size_t h = hash(key);
  size_t best = size;
  bool stale = false;
  auto [lo, hi] = snap->positions.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (it->second < size && key_at(ctx, it->second) == key) {
      best = std::min(best, it->second);
    } else if (it->second >= size || hash(key_at(ctx, it->second)) != h) {
      stale = true;  // an indexed element no longer has this key's hash
    }
  }
  if (best < size && !stale) return best;
  // Absent, or the snapshot is out of date: the linear scan is the truth.
  for (size_t i = 0; i < size; ++i) {
    if (key_at(ctx, i) == key) {
      if (i != best) build();
      return i;
    }
  }
  if (stale) build();
  return size;
}

}  // namespace fc
