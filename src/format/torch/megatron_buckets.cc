// Why the search works and where it stops (the header gives the rules).
//
// Megatron's ParamAndGradBuffer gives each param a range of the buffer (its start padded to
// 64 elements with the distributed optimizer), closes a bucket after the param that fills
// it, and pads bucket ends; sharded_param_state_dp_reshardable saves each bucket without its
// end padding, each DP rank's pieces (params, and the gaps between them) as separate
// ShardedTensors of the bucket's key, so each is a chunk of the DCP tensor: no stored chunk
// spans two params or a param and a gap. The master -> model rounding is what Megatron does
// after every step (copy_ of the fp32 main params into the model params), so a candidate
// that passes is the param unless two params hold equal weights, which the tie rule or a
// refusal settles.
#include "src/format/torch/megatron_buckets.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/torch_save.h"

namespace fc {
namespace {

constexpr std::string_view kMarker = "optimizer.distributed.dp_group_idx_";
constexpr int64_t kAlignment = 64;  // ParamAndGradBuffer's param start padding
constexpr int64_t kSamples = 8;
constexpr int64_t kCompareBlock = 1 << 16;  // elements per read of a whole-param comparison

// "<digits>" at the front of `s`, consumed.
std::optional<int64_t> TakeNumber(std::string_view& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return v;
}

std::string ShortestText(float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : "?";
}

bool TakePrefix(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// One bucket's state tensors.
struct Bucket {
  std::string group;  // "[chained_<k>.]dp_group_idx_<i>"
  std::string prefix;
  int64_t group_index = 0, gbuf = 0, index = 0;
  DType param_dtype = DType::kBFloat16;
  std::string base;  // the key up to ".<state>"
  std::map<std::string, TensorEntry*> states;  // "param", "exp_avg", ...
};

// Parses "<prefix>optimizer.distributed.dp_group_idx_<i>.gbuf_idx_<g>.dtype_(torch.<p>,
// torch.<g>).bucket_idx_<b>.<state>".
std::optional<std::pair<Bucket, std::string>> ParseBucketKey(std::string_view key) {
  const size_t at = key.find(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  Bucket b;
  b.prefix = std::string(key.substr(0, at));
  std::string_view s = key.substr(at + kMarker.size());
  auto group = TakeNumber(s);
  if (!group || !TakePrefix(s, ".gbuf_idx_")) return std::nullopt;
  auto gbuf = TakeNumber(s);
  if (!gbuf || !TakePrefix(s, ".dtype_(torch.")) return std::nullopt;
  const size_t comma = s.find(", torch.");
  const size_t close = s.find(").bucket_idx_");
  if (comma == std::string_view::npos || close == std::string_view::npos || comma > close) {
    return std::nullopt;
  }
  auto dtype = TorchDTypeFromName(s.substr(0, comma));
  if (!dtype.ok()) return std::nullopt;
  s.remove_prefix(close + std::string_view(").bucket_idx_").size());
  auto index = TakeNumber(s);
  if (!index || !TakePrefix(s, ".") || s.empty()) return std::nullopt;
  b.group_index = *group;
  b.gbuf = *gbuf;
  b.index = *index;
  b.param_dtype = *dtype;
  b.group = b.prefix + "dp_group_idx_" + std::to_string(*group);
  b.base = std::string(key.substr(0, key.size() - s.size() - 1));
  return std::make_pair(std::move(b), std::string(s));
}

// A local param of the model: one chunk of a model tensor, or SwiGLU's gate and up chunks.
struct Candidate {
  const TensorEntry* tensor = nullptr;
  std::vector<const Chunk*> parts;
  int64_t numel = 0;
};

// Where a candidate was found.
struct Placement {
  const Bucket* bucket = nullptr;
  int64_t start = 0;
  const Candidate* candidate = nullptr;
};

class Mapper {
 public:
  Mapper(CheckpointIndex& index, const std::function<bool(const Chunk&)>& locate)
      : index_(index), reader_(index), locate_(locate) {}
  Status Find();
  Status Replace(int64_t* params, int64_t* stateless);
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  Status Collect();
  void AddCandidates(const TensorEntry& t);
  // Elements [first, first + count) of `c`'s row-major flattening (parts in order) as bytes.
  Status ReadCandidate(const Candidate& c, int64_t first, int64_t count, std::byte* dst);
  // Elements [first, first + count) of a 1-D bucket state tensor as bytes.
  Status ReadBucket(const TensorEntry& t, int64_t first, int64_t count, std::byte* dst);
  // The masters at [p, p + count) of `b` rounded to the model dtype.
  Status RoundedMasters(const Bucket& b, int64_t p, int64_t count, std::vector<std::byte>* out);
  Result<bool> Matches(const Bucket& b, int64_t p, const Candidate& c, bool whole);
  Status WalkBucket(const Bucket& b);
  std::string Where(const Bucket& b, int64_t p) const {
    return "'" + b.base + "' position " + std::to_string(p);
  }

  CheckpointIndex& index_;
  ChunkReader reader_;
  const std::function<bool(const Chunk&)>& locate_;
  std::vector<Bucket> buckets_;
  std::vector<std::unique_ptr<Candidate>> candidates_;
  // (model dtype, first element's bytes) -> candidates
  std::map<std::pair<DType, std::string>, std::vector<const Candidate*>> by_first_;
  std::set<std::pair<std::string, const Chunk*>> used_;  // (group, model chunk)
  std::vector<Placement> placements_;
};

void Mapper::AddCandidates(const TensorEntry& t) {
  for (const Chunk& c : t.chunks) {
    if (c.replica_id != 0 || c.flat_range || c.box.empty()) continue;
    auto cand = std::make_unique<Candidate>();
    cand->tensor = &t;
    cand->parts = {&c};
    cand->numel = c.box.num_elements();
    candidates_.push_back(std::move(cand));
  }
  // SwiGLU (apply_swiglu_sharded_factory): a TP rank's linear_fc1 param is its gate rows then
  // its up rows, saved as fragments t and T + t of the fc1 axis (2T fragments).
  const bool weight = t.key.ends_with("linear_fc1.weight");
  if ((!weight && !t.key.ends_with("linear_fc1.bias")) || t.global_shape.size() < 1) return;
  const size_t axis = t.global_shape.size() - (weight ? 2 : 1);
  if (weight && t.global_shape.size() < 2) return;
  std::map<std::pair<Shape, Shape>, std::vector<const Chunk*>> lines;  // the other axes
  for (const Chunk& c : t.chunks) {
    if (c.replica_id != 0 || c.flat_range || c.box.empty()) continue;
    Shape off = c.box.global_offset, size = c.box.local_shape;
    off[axis] = size[axis] = 0;
    lines[{off, size}].push_back(&c);
  }
  for (auto& [other, line] : lines) {
    std::sort(line.begin(), line.end(), [axis](const Chunk* a, const Chunk* b) {
      return a->box.global_offset[axis] < b->box.global_offset[axis];
    });
    const size_t half = line.size() / 2;
    if (line.size() < 2 || line.size() % 2 != 0) continue;
    for (size_t i = 0; i < half; ++i) {
      if (line[i]->box.local_shape != line[i + half]->box.local_shape) continue;
      auto cand = std::make_unique<Candidate>();
      cand->tensor = &t;
      cand->parts = {line[i], line[i + half]};
      cand->numel = 2 * line[i]->box.num_elements();
      candidates_.push_back(std::move(cand));
    }
  }
}

Status Mapper::Collect() {
  std::map<std::string, Bucket> by_base;
  for (TensorEntry& t : index_.tensors) {
    auto parsed = ParseBucketKey(t.key);
    if (!parsed) continue;
    auto [it, inserted] = by_base.try_emplace(parsed->first.base, std::move(parsed->first));
    it->second.states[parsed->second] = &t;
  }
  for (auto& [base, b] : by_base) {
    const TensorEntry* param = b.states.count("param") ? b.states["param"] : nullptr;
    if (param == nullptr) return InvalidArgumentError("'" + base + "' has no .param tensor");
    if (param->dtype != DType::kFloat32) {
      return UnimplementedError("'" + base + ".param' is " + std::string(DTypeName(param->dtype)) +
                                ", not fp32 master weights (a precision-aware optimizer)");
    }
    for (const auto& [state, t] : b.states) {
      if (t->global_shape.size() != 1 || t->global_shape != param->global_shape) {
        return InvalidArgumentError("'" + t->key + "' has shape " +
                                    Box::Whole(t->global_shape).ToString() + ", '" + param->key +
                                    "' " + Box::Whole(param->global_shape).ToString());
      }
      std::sort(t->chunks.begin(), t->chunks.end(), [](const Chunk& x, const Chunk& y) {
        return x.box.global_offset[0] < y.box.global_offset[0];
      });
      int64_t at = 0;
      for (const Chunk& c : t->chunks) {
        if (c.flat_range || c.box.global_offset[0] != at) {
          return InvalidArgumentError("'" + t->key + "': its stored pieces do not tile it at " +
                                      std::to_string(at));
        }
        at += c.box.local_shape[0];
      }
      if (at != t->global_shape[0]) {
        return InvalidArgumentError("'" + t->key + "': its stored pieces end at " +
                                    std::to_string(at) + " of " + std::to_string(t->global_shape[0]));
      }
    }
    for (const auto& [state, t] : b.states) {
      if (t->chunks.size() != param->chunks.size()) {
        return InvalidArgumentError("'" + t->key + "' is cut unlike '" + param->key + "'");
      }
      for (size_t i = 0; i < t->chunks.size(); ++i) {
        if (t->chunks[i].box != param->chunks[i].box) {
          return InvalidArgumentError("'" + t->key + "' is cut unlike '" + param->key + "'");
        }
      }
    }
    buckets_.push_back(std::move(b));
  }
  std::sort(buckets_.begin(), buckets_.end(), [](const Bucket& x, const Bucket& y) {
    return std::tie(x.prefix, x.group_index, x.gbuf, x.index) <
           std::tie(y.prefix, y.group_index, y.gbuf, y.index);
  });
  for (const TensorEntry& t : index_.tensors) {
    if (t.key.find("optimizer.") != std::string::npos || !IsFloating(t.dtype)) continue;
    AddCandidates(t);
  }
  for (const auto& c : candidates_) {
    const size_t item = DTypeSize(c->tensor->dtype);
    std::string first(item, '\0');
    FC_RETURN_IF_ERROR(ReadCandidate(*c, 0, 1, reinterpret_cast<std::byte*>(first.data())));
    by_first_[{c->tensor->dtype, first}].push_back(c.get());
  }
  return Status::Ok();
}

Status Mapper::ReadCandidate(const Candidate& c, int64_t first, int64_t count, std::byte* dst) {
  const size_t item = DTypeSize(c.tensor->dtype);
  int64_t part_start = 0;
  for (const Chunk* part : c.parts) {
    const int64_t n = part->box.num_elements();
    const int64_t lo = std::max(first, part_start), hi = std::min(first + count, part_start + n);
    if (lo < hi) {
      // The flat range [lo, hi) of the part's box, as boxes in flat order.
      const Shape& shape = part->box.local_shape;
      int64_t written = lo - first;
      for (const Box& rel : DecomposeFlatRange(shape, {lo - part_start, hi - part_start})) {
        Box region = rel;
        for (size_t d = 0; d < region.rank(); ++d) {
          region.global_offset[d] += part->box.global_offset[d];
        }
        FC_RETURN_IF_ERROR(reader_.CopyChunkRegion(*c.tensor, *part, region,
                                                   dst + written * item, region));
        written += region.num_elements();
      }
    }
    part_start += n;
  }
  return Status::Ok();
}

Status Mapper::ReadBucket(const TensorEntry& t, int64_t first, int64_t count, std::byte* dst) {
  const Box region{{first}, {count}};
  // Chunks are sorted by offset (Collect): from the last one starting at or before `first`.
  auto it = std::upper_bound(t.chunks.begin(), t.chunks.end(), first,
                             [](int64_t v, const Chunk& c) { return v < c.box.inclusive_min(0); });
  if (it != t.chunks.begin()) --it;
  for (; it != t.chunks.end() && it->box.inclusive_min(0) < first + count; ++it) {
    FC_RETURN_IF_ERROR(reader_.CopyChunkRegion(t, *it, region, dst, region));
  }
  return Status::Ok();
}

Status Mapper::RoundedMasters(const Bucket& b, int64_t p, int64_t count,
                              std::vector<std::byte>* out) {
  std::vector<float> m(static_cast<size_t>(count));
  FC_RETURN_IF_ERROR(ReadBucket(*b.states.at("param"), p, count,
                                reinterpret_cast<std::byte*>(m.data())));
  out->resize(static_cast<size_t>(count) * DTypeSize(b.param_dtype));
  return ConvertElements(m.data(), DType::kFloat32, out->data(), b.param_dtype,
                         static_cast<size_t>(count));
}

// Equal as the model holds them: the same bytes, or NaN in both.
bool SameElements(const std::byte* a, const std::byte* b, size_t count, DType dtype) {
  const size_t item = DTypeSize(dtype);
  if (std::memcmp(a, b, count * item) == 0) return true;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * item, b + i * item, item) == 0) continue;
    float x = 0, y = 0;
    if (!ConvertElements(a + i * item, dtype, &x, DType::kFloat32, 1).ok() ||
        !ConvertElements(b + i * item, dtype, &y, DType::kFloat32, 1).ok() || x == x || y == y) {
      return false;
    }
  }
  return true;
}

// Whether candidate `c` holds the masters at [p, p + numel) rounded: on kSamples elements
// spread over it, or on all of them.
Result<bool> Mapper::Matches(const Bucket& b, int64_t p, const Candidate& c, bool whole) {
  const size_t item = DTypeSize(c.tensor->dtype);
  std::vector<std::byte> want, got;
  if (!whole) {
    std::set<int64_t> at = {0, c.numel - 1};
    for (int64_t k = 1; k < kSamples - 1; ++k) at.insert(k * c.numel / (kSamples - 1));
    for (int64_t i : at) {
      got.resize(item);
      FC_RETURN_IF_ERROR(ReadCandidate(c, i, 1, got.data()));
      FC_RETURN_IF_ERROR(RoundedMasters(b, p + i, 1, &want));
      if (!SameElements(got.data(), want.data(), 1, c.tensor->dtype)) return false;
    }
    return true;
  }
  for (int64_t i = 0; i < c.numel; i += kCompareBlock) {
    const int64_t n = std::min(kCompareBlock, c.numel - i);
    got.resize(static_cast<size_t>(n) * item);
    FC_RETURN_IF_ERROR(ReadCandidate(c, i, n, got.data()));
    FC_RETURN_IF_ERROR(RoundedMasters(b, p + i, n, &want));
    if (!SameElements(got.data(), want.data(), static_cast<size_t>(n), c.tensor->dtype)) {
      return false;
    }
  }
  return true;
}

// Stacked layers of one tensor (Megatron-Core's "decoder.layers." keys put the layer on axis
// 0): `a` and `b` differ only there.
bool LayersOfOneTensor(const Candidate& a, const Candidate& b) {
  if (a.tensor != b.tensor || a.parts.size() != b.parts.size() ||
      a.tensor->key.find("layers.") == std::string::npos) {
    return false;
  }
  for (size_t i = 0; i < a.parts.size(); ++i) {
    const Box& x = a.parts[i]->box;
    const Box& y = b.parts[i]->box;
    if (x.local_shape != y.local_shape || x.rank() == 0) return false;
    for (size_t d = 1; d < x.rank(); ++d) {
      if (x.global_offset[d] != y.global_offset[d]) return false;
    }
  }
  return true;
}

Status Mapper::WalkBucket(const Bucket& b) {
  const TensorEntry& master = *b.states.at("param");
  const int64_t end = master.global_shape[0];
  std::set<int64_t> starts, ends;
  for (const Chunk& c : master.chunks) {
    starts.insert(c.box.inclusive_min(0));
    ends.insert(c.box.exclusive_max(0));
  }
  int64_t p = 0;
  while (true) {
    if (!starts.count(p)) {
      return InvalidArgumentError(Where(b, p) + ": no stored piece starts there (a param "
                                  "start, 64-aligned after the param before it)");
    }
    std::vector<std::byte> first;
    FC_RETURN_IF_ERROR(RoundedMasters(b, p, 1, &first));
    float value = 0;
    FC_RETURN_IF_ERROR(ReadBucket(master, p, 1, reinterpret_cast<std::byte*>(&value)));
    std::vector<const Candidate*> passed;
    auto it = by_first_.find({b.param_dtype, std::string(reinterpret_cast<const char*>(
                                                 first.data()), first.size())});
    for (const Candidate* c : it == by_first_.end() ? std::vector<const Candidate*>()
                                                    : it->second) {
      if (p + c->numel > end || !ends.count(p + c->numel)) continue;
      bool free = true;
      for (const Chunk* part : c->parts) free = free && !used_.count({b.group, part});
      if (!free) continue;
      FC_ASSIGN_OR_RETURN(bool ok, Matches(b, p, *c, false));
      if (ok) passed.push_back(c);
    }
    if (passed.size() > 1) {
      std::vector<const Candidate*> whole;
      for (const Candidate* c : passed) {
        FC_ASSIGN_OR_RETURN(bool ok, Matches(b, p, *c, true));
        if (ok) whole.push_back(c);
      }
      passed = std::move(whole);
    }
    // SwiGLU's gate chunk alone is the start of its gate + up param: the param is the longer.
    std::erase_if(passed, [&passed](const Candidate* c) {
      return std::any_of(passed.begin(), passed.end(), [c](const Candidate* longer) {
        return longer->parts.size() > c->parts.size() &&
               std::equal(c->parts.begin(), c->parts.end(), longer->parts.begin());
      });
    });
    if (passed.empty()) {
      return InvalidArgumentError(Where(b, p) + ": no model param's weight is the master " +
                                  "weights there rounded (the first is " + ShortestText(value) +
                                  ")");
    }
    const Candidate* chosen = passed.front();
    for (const Candidate* c : passed) {
      if (c == chosen) continue;
      if (!LayersOfOneTensor(*c, *chosen)) {
        return InvalidArgumentError(
            Where(b, p) + ": '" + chosen->tensor->key + "' " + chosen->parts[0]->box.ToString() +
            " and '" + c->tensor->key + "' " + c->parts[0]->box.ToString() +
            " hold the same values, so which one the states there belong to is not known");
      }
      // Reverse registration order: the highest layer first.
      if (c->parts[0]->box.global_offset[0] > chosen->parts[0]->box.global_offset[0]) chosen = c;
    }
    for (const Chunk* part : chosen->parts) used_.insert({b.group, part});
    placements_.push_back({&b, p, chosen});
    const int64_t param_end = p + chosen->numel;
    if (param_end == end) return Status::Ok();
    p = (param_end + kAlignment - 1) / kAlignment * kAlignment;
    if (p >= end) {
      return InvalidArgumentError(Where(b, param_end) + ": a param ends there, but the bucket "
                                  "goes on to " + std::to_string(end) + " without another");
    }
  }
}

Status Mapper::Find() {
  FC_RETURN_IF_ERROR(Collect());
  for (const Bucket& b : buckets_) FC_RETURN_IF_ERROR(WalkBucket(b));
  return Status::Ok();
}

Status Mapper::Replace(int64_t* params, int64_t* stateless) {
  // The placement each candidate's states come from: its first (the lowest group).
  std::map<const Candidate*, const Placement*> chosen;
  for (const Placement& pl : placements_) chosen.try_emplace(pl.candidate, &pl);
  // Per model tensor and state: the chunks, each a flattened range of a param part's box.
  std::map<std::pair<const TensorEntry*, std::string>, TensorEntry> out;
  for (const Placement& pl : placements_) {
    if (chosen.at(pl.candidate) != &pl) continue;
    const Candidate& c = *pl.candidate;
    for (const auto& [state, t] : pl.bucket->states) {
      const std::string name = state == "param" ? "fp32_param" : state;
      TensorEntry& e = out[{c.tensor, name}];
      if (e.key.empty()) {
        e.key = "optimizer.state." + name + "." + c.tensor->key;
        e.dtype = t->dtype;
        e.global_shape = c.tensor->global_shape;
      } else if (e.dtype != t->dtype) {
        return InvalidArgumentError("'" + t->key + "' is " + std::string(DTypeName(t->dtype)) +
                                    ", another bucket's " + name + " of '" + c.tensor->key +
                                    "' is " + std::string(DTypeName(e.dtype)));
      }
      const size_t item = DTypeSize(t->dtype);
      // The stored pieces in [start, start + numel): from the last one starting at or before.
      auto it = std::upper_bound(
          t->chunks.begin(), t->chunks.end(), pl.start,
          [](int64_t v, const Chunk& ch) { return v < ch.box.inclusive_min(0); });
      if (it != t->chunks.begin()) --it;
      for (; it != t->chunks.end() && it->box.inclusive_min(0) < pl.start + c.numel; ++it) {
        const Chunk& stored = *it;
        const int64_t a = stored.box.inclusive_min(0), z = stored.box.exclusive_max(0);
        if (z <= pl.start) continue;
        if (a < pl.start || z > pl.start + c.numel) {
          return InvalidArgumentError("'" + t->key + "' piece [" + std::to_string(a) + ", " +
                                      std::to_string(z) + ") crosses the end of '" +
                                      c.tensor->key + "' " + c.parts[0]->box.ToString());
        }
        // The parts [a, z) covers, as (part, flat range of its box).
        std::vector<std::pair<const Chunk*, FlatRange>> covered;
        int64_t part_start = pl.start;
        for (const Chunk* part : c.parts) {
          const int64_t n = part->box.num_elements();
          const int64_t lo = std::max(a, part_start), hi = std::min(z, part_start + n);
          if (lo < hi) covered.push_back({part, FlatRange{lo - part_start, hi - part_start}});
          part_start += n;
        }
        if (covered.size() == 1 && stored.strides.empty() && !locate_(stored)) {
          // The piece keeps its place as read (an unlocated item is found on first read; a
          // 1-D item of the range's length is what LocateTorchDcpChunk expects for it).
          Chunk mapped = stored;
          mapped.box = covered[0].first->box;
          mapped.flat_range = covered[0].second;
          e.chunks.push_back(std::move(mapped));
          continue;
        }
        // A piece that spans SwiGLU's gate and up rows (or whose item must be found now): cut
        // at its exact place.
        FC_ASSIGN_OR_RETURN(ChunkLocation loc, reader_.Locate(*t, stored));
        if (!loc.strides.empty() && loc.strides != Shape{1}) {
          return UnimplementedError("'" + t->key + "' piece at " + std::to_string(a) +
                                    " is a strided view");
        }
        uint64_t offset = loc.byte_offset;
        for (const auto& [part, range] : covered) {
          Chunk mapped;
          mapped.box = part->box;
          mapped.flat_range = range;
          mapped.file = stored.file;
          mapped.encoded_item = stored.encoded_item;
          mapped.byte_offset = offset;
          mapped.byte_length = static_cast<uint64_t>(range.size()) * item;
          offset += mapped.byte_length;
          e.chunks.push_back(std::move(mapped));
        }
      }
    }
  }
  // Every model tensor with states has them for all of its local params.
  std::set<const TensorEntry*> with_states;
  for (const auto& [c, pl] : chosen) with_states.insert(c->tensor);
  for (const TensorEntry* t : with_states) {
    int64_t covered = 0, total = 0;
    for (const auto& [c, pl] : chosen) {
      if (c->tensor == t) covered += c->numel;
    }
    for (const Chunk& ch : t->chunks) {
      if (ch.replica_id == 0) total += ch.box.num_elements();
    }
    if (covered != total) {
      return InvalidArgumentError("'" + t->key + "': the buckets hold states for " +
                                  std::to_string(covered) + " of its " + std::to_string(total) +
                                  " elements");
    }
  }
  *params = static_cast<int64_t>(chosen.size());
  *stateless = 0;
  // The states after the model tensors: in the model's order, each tensor's master first.
  std::vector<TensorEntry> states;
  for (const TensorEntry& t : index_.tensors) {
    auto first = out.find({&t, "fp32_param"});
    if (first != out.end()) states.push_back(std::move(first->second));
    for (auto it = out.lower_bound({&t, std::string()});
         it != out.end() && it->first.first == &t; ++it) {
      if (it->first.second != "fp32_param") states.push_back(std::move(it->second));
    }
  }
  std::vector<TensorEntry> tensors;
  for (TensorEntry& t : index_.tensors) {
    if (ParseBucketKey(t.key)) continue;
    if (t.key.find("optimizer.") == std::string::npos && IsFloating(t.dtype) &&
        !with_states.count(&t)) {
      ++*stateless;
    }
    tensors.push_back(std::move(t));
  }
  for (TensorEntry& e : states) tensors.push_back(std::move(e));
  index_.tensors = std::move(tensors);
  return Status::Ok();
}

}  // namespace

MegatronBucketsOutcome MapMegatronDpReshardable(
    CheckpointIndex& index, const std::function<bool(const Chunk&)>& locate_now) {
  MegatronBucketsOutcome outcome;
  for (const TensorEntry& t : index.tensors) {
    if (ParseBucketKey(t.key)) outcome.found = true;
  }
  if (!outcome.found) return outcome;
  Status status = Status::Ok();
  int64_t params = 0, stateless = 0, buckets = 0;
  {
    Mapper mapper(index, locate_now);
    status = mapper.Find();
    buckets = mapper.buckets();
    if (status.ok()) status = mapper.Replace(&params, &stateless);
  }
  if (!status.ok()) {
    outcome.note = "not mapped to params: " + status.message();
    return outcome;
  }
  outcome.mapped = true;
  outcome.note = std::to_string(buckets) + " bucket(s) mapped to the states of " +
                 std::to_string(params) + " local param(s) (found by master -> model rounding)";
  if (stateless > 0) {
    outcome.note += "; " + std::to_string(stateless) + " model tensor(s) without states";
  }
  return outcome;
}

}  // namespace fc
