// Why the search works and where it stops (the header gives the rules).
//
// Megatron's ParamAndGradBuffer gives each param a range of the buffer (its start padded to
// 64 elements with the distributed optimizer), closes a bucket after the param that fills
// it, and pads bucket ends; sharded_param_state_dp_reshardable saves each bucket without its
// end padding, each DP rank's pieces (params, and the gaps between them) as separate
// ShardedTensors of the bucket's key, so each is a chunk of the DCP tensor: no stored chunk
// spans two params or a param and a gap. (get_parameter_state_dp_zero, behind
// dp_zero_gather_scatter, gathers the same buckets into zeroed buffers and drops each
// bucket's end padding, so there buckets follow each other unaligned and nothing marks
// where a param ends: the walk then tries both places the next param can start.) The
// master -> model rounding is what Megatron does
// after every step (copy_ of the fp32 main params into the model params), so a candidate
// that passes is the param unless two params hold equal weights, which the tie rule or a
// refusal settles.
#include "src/format/megatron/megatron_buckets.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "fc/codec/zip.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"

namespace fc {
namespace {

constexpr std::string_view kMarker = "optimizer.distributed.dp_group_idx_";
constexpr int64_t kAlignment = 64;  // ParamAndGradBuffer's param start padding
constexpr int64_t kSamples = 8;
constexpr int64_t kCompareBlock = 1 << 16;  // elements per read of a whole-param comparison
constexpr size_t kMaxWholeCompares = 64;    // candidates compared whole at one position
// Elements read in all before the search gives up (a hostile checkpoint whose params all
// look alike would otherwise make it quadratic).
constexpr int64_t kMaxElementsRead = int64_t{1} << 32;

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
  // dp_zero_gather_scatter: one tensor per buffer, every bucket's params back to back, in
  // one located chunk (no piece boundaries to follow).
  bool coalesced = false;
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

// "<prefix>optimizer.distributed.dp_group_idx_<i>.param_state/shard_0_1", the
// dp_zero_gather_scatter ShardedObject: (prefix, i).
std::optional<std::pair<std::string, int64_t>> ParseDpZeroKey(std::string_view key) {
  const size_t at = key.find(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view s = key.substr(at + kMarker.size());
  auto group = TakeNumber(s);
  if (!group || s != ".param_state/shard_0_1") return std::nullopt;
  return std::make_pair(std::string(key.substr(0, at)), *group);
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
  Status AddDpZero(const ObjectEntry& o, const std::string& prefix, int64_t group,
                   std::map<std::string, Bucket>* by_base);
  void AddCandidates(const TensorEntry& t);
  // Counts elements read against kMaxElementsRead (kResourceExhausted past it).
  Status CountRead(int64_t elements);
  // Elements [first, first + count) of `c`'s row-major flattening (parts in order) as bytes.
  Status ReadCandidate(const Candidate& c, int64_t first, int64_t count, std::byte* dst);
  // Elements [first, first + count) of a 1-D bucket state tensor as bytes.
  Status ReadBucket(const TensorEntry& t, int64_t first, int64_t count, std::byte* dst);
  // The masters at [p, p + count) of `b` rounded to the model dtype.
  Status RoundedMasters(const Bucket& b, int64_t p, int64_t count, std::vector<std::byte>* out);
  Result<bool> Matches(const Bucket& b, int64_t p, const Candidate& c, bool whole);
  Result<const Candidate*> FindAt(const Bucket& b, int64_t p, int64_t end,
                                  const std::set<int64_t>* ends);
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
  std::deque<TensorEntry> synthetic_;       // dp_zero_gather_scatter states (stable addresses)
  std::set<std::string> dp_zero_objects_;   // the objects they came from
  int64_t elements_read_ = 0;
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

// The dp_zero_gather_scatter object (a torch.save archive inside a .distcp file): the dict
// get_parameter_state_dp_zero returns, {"buckets_coalesced": True, <buffer index>:
// {(<param dtype>, <grad dtype>): {"param", "exp_avg", "exp_avg_sq": 1-D fp32 tensors,
// "numel_unpadded": int}}}. Each state tensor becomes a coalesced bucket's state, read in
// place from the archive's storage record. Only data.pkl and the zip directory are read.
Status Mapper::AddDpZero(const ObjectEntry& o, const std::string& prefix, int64_t group,
                         std::map<std::string, Bucket>* by_base) {
  if (o.encoding != ObjectEncoding::kTorchSave || o.encoded_item) {
    return UnimplementedError("'" + o.key + "' is not a plain torch.save item");
  }
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* file, reader_.File(o.file));
  ZipReadFn read = [file, &o](uint64_t offset, std::span<std::byte> dst) -> Status {
    if (offset > o.byte_length || dst.size() > o.byte_length - offset) {
      return DataLossError("read past the item's " + std::to_string(o.byte_length) + " bytes");
    }
    return file->ReadAt(o.byte_offset + offset, dst);
  };
  const std::string where = "'" + o.key + "'";
  FC_ASSIGN_OR_RETURN(TorchSaveArchive archive,
                      ReadTorchSaveArchive(o.byte_length, read).With(where));
  FC_ASSIGN_OR_RETURN(PickleValue root,
                      ReadTorchSavePickle(archive, read, uint64_t{16} << 20).With(where));
  const PickleValue* coalesced = root.Find("buckets_coalesced");
  if (coalesced == nullptr || coalesced->kind != PickleValue::Kind::kBool ||
      !coalesced->bool_value) {
    return UnimplementedError(where + " is not the buckets_coalesced form (Megatron before "
                              "February 2024)");
  }
  for (const auto& [gbuf, by_dtype] : root.entries) {
    if (!gbuf || !gbuf->is_int()) continue;
    if (!by_dtype || !by_dtype->is_dict()) {
      return InvalidArgumentError(where + " buffer " + std::to_string(gbuf->int_value) +
                                  " is not a dict");
    }
    for (const auto& [dtypes, states] : by_dtype->entries) {
      const PickleValue* param_dtype =
          dtypes && dtypes->is_tuple() && dtypes->items.size() == 2 ? dtypes->items[0].get()
                                                                     : nullptr;
      if (param_dtype == nullptr || param_dtype->kind != PickleValue::Kind::kGlobal ||
          param_dtype->str != "torch" || !states || !states->is_dict()) {
        return InvalidArgumentError(where + " buffer " + std::to_string(gbuf->int_value) +
                                    ": not {(param dtype, grad dtype): {state: tensor}}");
      }
      Bucket b;
      FC_ASSIGN_OR_RETURN(b.param_dtype, TorchDTypeFromName(param_dtype->name).With(where));
      b.prefix = prefix;
      b.group_index = group;
      b.gbuf = gbuf->int_value;
      b.group = prefix + "dp_group_idx_" + std::to_string(group);
      b.base = o.key + " [" + std::to_string(b.gbuf) + "][(" + param_dtype->name + ", ...)]";
      b.coalesced = true;
      for (const auto& [name, value] : states->entries) {
        if (!name || !name->is_str() || !value || name->str == "numel_unpadded") continue;
        auto ref = DecodeTorchTensor(*value);
        if (!ref.ok()) return ref.status().With(where + " '" + name->str + "'");
        const ZipEntry* record = archive.FindRecord("data/" + ref->storage_key);
        if (record == nullptr || record->method != 0 ||
            record->compressed_size != ref->storage_bytes ||
            record->data_exclusive_max() > o.byte_length || ref->shape.size() != 1 ||
            !ref->IsRowMajorContiguous()) {
          return InvalidArgumentError(where + " '" + name->str + "': not a 1-D tensor stored "
                                      "in place");
        }
        TensorEntry& t = synthetic_.emplace_back();
        t.key = b.base + "['" + name->str + "']";
        t.dtype = ref->dtype;
        t.global_shape = ref->shape;
        Chunk c;
        c.box = Box::Whole(ref->shape);
        c.file = o.file;
        c.byte_offset = o.byte_offset + record->data_offset +
                        static_cast<uint64_t>(ref->storage_offset) * DTypeSize(ref->dtype);
        c.byte_length = ref->ViewSpanBytes();
        t.chunks.push_back(std::move(c));
        b.states[name->str] = &t;
      }
      by_base->emplace(b.base, std::move(b));
    }
  }
  dp_zero_objects_.insert(o.key);
  return Status::Ok();
}

Status Mapper::Collect() {
  std::map<std::string, Bucket> by_base;
  for (TensorEntry& t : index_.tensors) {
    auto parsed = ParseBucketKey(t.key);
    if (!parsed) continue;
    auto [it, inserted] = by_base.try_emplace(parsed->first.base, std::move(parsed->first));
    it->second.states[parsed->second] = &t;
  }
  for (const ObjectEntry& o : index_.objects) {
    if (auto parsed = ParseDpZeroKey(o.key)) {
      FC_RETURN_IF_ERROR(AddDpZero(o, parsed->first, parsed->second, &by_base));
    }
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
  FC_RETURN_IF_ERROR(CountRead(count));
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

Status Mapper::CountRead(int64_t elements) {
  elements_read_ += elements;
  if (elements_read_ > kMaxElementsRead) {
    return ResourceExhaustedError("the search read more than " +
                                  std::to_string(kMaxElementsRead) + " elements");
  }
  return Status::Ok();
}

Status Mapper::ReadBucket(const TensorEntry& t, int64_t first, int64_t count, std::byte* dst) {
  FC_RETURN_IF_ERROR(CountRead(count));
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

// The param at `p` of `b`: the free candidate whose weight is the masters there rounded, that
// ends before `end` and, in a bucket of stored pieces, where a piece ends; nullptr when none.
// Errors: two candidates with the same values that the layer order does not tell apart, and
// read errors.
Result<const Candidate*> Mapper::FindAt(const Bucket& b, int64_t p, int64_t end,
                                        const std::set<int64_t>* ends) {
  std::vector<std::byte> first;
  FC_RETURN_IF_ERROR(RoundedMasters(b, p, 1, &first));
  std::vector<const Candidate*> passed;
  auto it = by_first_.find(
      {b.param_dtype, std::string(reinterpret_cast<const char*>(first.data()), first.size())});
  if (it == by_first_.end()) return nullptr;
  for (const Candidate* c : it->second) {
    if (p + c->numel > end || (ends != nullptr && !ends->count(p + c->numel))) continue;
    bool free = true;
    for (const Chunk* part : c->parts) free = free && !used_.count({b.group, part});
    if (!free) continue;
    FC_ASSIGN_OR_RETURN(bool ok, Matches(b, p, *c, false));
    if (ok) passed.push_back(c);
  }
  if (passed.size() > 1) {
    // Layers of one stacked tensor: the highest one that holds the values (the tie rule
    // below would pick it among equals). Otherwise every candidate is compared whole.
    const bool layers = std::all_of(passed.begin(), passed.end(), [&passed](const Candidate* c) {
      return LayersOfOneTensor(*c, *passed.front());
    });
    if (layers) {
      std::sort(passed.begin(), passed.end(), [](const Candidate* x, const Candidate* y) {
        return x->parts[0]->box.global_offset[0] > y->parts[0]->box.global_offset[0];
      });
    } else if (passed.size() > kMaxWholeCompares) {
      return InvalidArgumentError(Where(b, p) + ": " + std::to_string(passed.size()) +
                                  " params of several tensors start with the values there");
    }
    std::vector<const Candidate*> whole;
    for (const Candidate* c : passed) {
      FC_ASSIGN_OR_RETURN(bool ok, Matches(b, p, *c, true));
      if (ok) whole.push_back(c);
      if (ok && layers) break;
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
  if (passed.empty()) return nullptr;
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
  return chosen;
}

// Walks `b` from its start. After a param ending at e, the next starts at e (params without
// alignment, Megatron-Core before 0.8; or, in a coalesced tensor, the next bucket) or at the
// next multiple of 64 from its bucket's start; the first of the two where a param is found.
Status Mapper::WalkBucket(const Bucket& b) {
  const TensorEntry& master = *b.states.at("param");
  const int64_t end = master.global_shape[0];
  std::set<int64_t> starts, ends;
  for (const Chunk& c : master.chunks) {
    starts.insert(c.box.inclusive_min(0));
    ends.insert(c.box.exclusive_max(0));
  }
  int64_t bucket_start = 0;  // in a coalesced tensor, where the current bucket starts
  std::vector<int64_t> next = {0};
  while (true) {
    const Candidate* found = nullptr;
    int64_t p = next.back();
    for (int64_t at : next) {
      if (!b.coalesced && !starts.count(at)) continue;
      FC_ASSIGN_OR_RETURN(found, FindAt(b, at, end, b.coalesced ? nullptr : &ends));
      if (found != nullptr) {
        p = at;
        break;
      }
    }
    if (found == nullptr) {
      if (!b.coalesced && !starts.count(p)) {
        return InvalidArgumentError(Where(b, p) + ": no stored piece starts there (where " +
                                    "the next param would, 64-aligned)");
      }
      float value = 0;
      FC_RETURN_IF_ERROR(ReadBucket(master, p, 1, reinterpret_cast<std::byte*>(&value)));
      return InvalidArgumentError(Where(b, p) + ": no model param's weight is the master " +
                                  "weights there rounded (the first is " + ShortestText(value) +
                                  ")");
    }
    if (b.coalesced && p == next.front()) bucket_start = p;
    for (const Chunk* part : found->parts) used_.insert({b.group, part});
    placements_.push_back({&b, p, found});
    const int64_t param_end = p + found->numel;
    if (param_end == end) return Status::Ok();
    const int64_t aligned =
        bucket_start + (param_end - bucket_start + kAlignment - 1) / kAlignment * kAlignment;
    next = {param_end};
    if (aligned != param_end && aligned < end) next.push_back(aligned);
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
      if (pl.bucket->coalesced) {
        // One located chunk of the whole buffer: each part is a packed box inside it.
        uint64_t offset = t->chunks.front().byte_offset + static_cast<uint64_t>(pl.start) * item;
        for (const Chunk* part : c.parts) {
          Chunk mapped;
          mapped.box = part->box;
          mapped.file = t->chunks.front().file;
          mapped.byte_offset = offset;
          mapped.byte_length = static_cast<uint64_t>(part->box.num_elements()) * item;
          offset += mapped.byte_length;
          e.chunks.push_back(std::move(mapped));
        }
        continue;
      }
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
  std::erase_if(index_.objects,
                [this](const ObjectEntry& o) { return dp_zero_objects_.count(o.key) > 0; });
  return Status::Ok();
}

}  // namespace

MegatronBucketsOutcome MapMegatronOptimizerBuckets(
    CheckpointIndex& index, const std::function<bool(const Chunk&)>& locate_now) {
  MegatronBucketsOutcome outcome;
  for (const TensorEntry& t : index.tensors) {
    if (ParseBucketKey(t.key)) outcome.found = true;
  }
  for (const ObjectEntry& o : index.objects) {
    if (ParseDpZeroKey(o.key)) outcome.found = true;
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
