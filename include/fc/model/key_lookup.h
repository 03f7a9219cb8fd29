// KeyLookupCache: O(1) lookup by `key` in a std::vector of structs that have a
// `std::string key` member (CheckpointIndex::tensors, TargetLayout::tensors), without
// changing those structs' value semantics.
//
// The cache is a hash index (hash of the key -> positions) built on first use and kept as
// an immutable snapshot tagged with the vector's data pointer and size. A snapshot that does
// not match the vector is rebuilt. Every hit is confirmed by comparing the key itself, and a
// miss is confirmed by a linear scan (a key renamed in place keeps pointer and size, so only
// a scan can tell), so a stale snapshot (keys edited in place, elements reordered) never
// gives a wrong answer; finding it stale rebuilds it. Cost: O(1) on average for a key that is
// present, O(n) for one that is absent.
//
// Copies and moves of the owner start with an empty cache; all caches compare equal, so a
// defaulted operator== of the owner keeps comparing values only.
//
// Thread-safety: concurrent Find calls on one cache are safe (the snapshot is swapped
// atomically). Find concurrent with a modification of the vector is not.
#ifndef FC_MODEL_KEY_LOOKUP_H_
#define FC_MODEL_KEY_LOOKUP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace fc {

class KeyLookupCache {
 public:
  KeyLookupCache() = default;
  KeyLookupCache(const KeyLookupCache&) {}
  KeyLookupCache& operator=(const KeyLookupCache&) {
    snapshot_.store(nullptr);
    return *this;
  }
  friend bool operator==(const KeyLookupCache&, const KeyLookupCache&) { return true; }

  // The first element of `items` whose key equals `key`, or nullptr.
  template <typename T>
  const T* Find(const std::vector<T>& items, std::string_view key) const {
    const size_t i = FindIndex(
        items.data(), items.size(),
        [&items](size_t k) -> std::string_view { return items[k].key; }, key);
    return i < items.size() ? &items[i] : nullptr;
  }

 private:
  struct Snapshot;
  using KeyAt = std::string_view (*)(const void* ctx, size_t i);
  template <typename F>
  size_t FindIndex(const void* data, size_t size, const F& key_at, std::string_view key) const {
    return FindIndexImpl(data, size, &key_at, [](const void* ctx, size_t i) {
      return (*static_cast<const F*>(ctx))(i);
    }, key);
  }
  size_t FindIndexImpl(const void* data, size_t size, const void* ctx, KeyAt key_at,
                       std::string_view key) const;

  mutable std::atomic<std::shared_ptr<const Snapshot>> snapshot_;
};

}  // namespace fc

#endif  // FC_MODEL_KEY_LOOKUP_H_
