// The partition math of the DeepSpeed writer. Contract: src/format/deepspeed/ds_partition.h.
#include "src/format/deepspeed/ds_partition.h"

#include <algorithm>

#include "fc/codec/pickle_build.h"
#include "fc/io/file.h"
#include "src/format/deepspeed/ds_tree_edit.h"

namespace fc::deepspeed_writer_internal {

int64_t PaddedLength(int64_t orig, int64_t dp) {
  const int64_t align = 2 * dp;
  return (orig + align - 1) / align * align;
}

int64_t LeanLength(int64_t orig, int64_t ps, int64_t r) {
  return std::clamp<int64_t>(orig - r * ps, 0, ps);
}

int64_t Repartitioner::AddSource(const std::string& key, const SourceFile& sf,
                                 const Located& l, int64_t elements) {
  TensorEntry t;
  t.key = key;
  t.dtype = l.ref.dtype;
  t.global_shape = {elements};
  Chunk c;
  c.box = Box::Whole(t.global_shape);
  c.file = sf.index;
  c.byte_offset = l.first;
  c.byte_length = static_cast<uint64_t>(elements) * DTypeSize(l.ref.dtype);
  if (elements > 1 && l.ref.strides[0] != 1) c.strides = {l.ref.strides[0]};
  if (!c.strides.empty()) {
    c.byte_length = (static_cast<uint64_t>(elements - 1) * l.ref.strides[0] + 1) *
                    DTypeSize(l.ref.dtype);
  }
  t.chunks.push_back(std::move(c));
  job_.source.tensors.push_back(std::move(t));
  return static_cast<int64_t>(job_.source.tensors.size() - 1);
}

uint32_t Repartitioner::AddFile(SourceFile& sf) {
  sf.index = static_cast<uint32_t>(job_.source.files.size());
  job_.source.files.push_back({Basename(sf.path), sf.size});
  return sf.index;
}

DsRecord Repartitioner::Partition(const GroupSource& g, const std::vector<int64_t>& sources,
                                  DType dtype, int64_t r, const std::string& name) const {
  return PartitionOver(g, sources, dtype, job_.source_dp, job_.dp, r, name);
}

DsRecord Repartitioner::PartitionOver(const GroupSource& g, const std::vector<int64_t>& sources,
                                      DType dtype, int64_t old_count, int64_t new_count,
                                      int64_t r, const std::string& name) {
  const int64_t ps_new = PaddedLength(g.orig, new_count) / new_count;
  const int64_t ps_old = PaddedLength(g.orig, old_count) / old_count;
  DsRecord rec;
  rec.kind = DsRecord::Kind::kStream;
  rec.dtype = dtype;
  rec.elements = ps_new;
  rec.bytes = static_cast<uint64_t>(ps_new) * DTypeSize(dtype);
  rec.name = name;
  const int64_t begin = r * ps_new, end = begin + ps_new;
  for (int64_t o = 0; o < old_count; ++o) {
    const int64_t lo = std::max(begin, o * ps_old);
    const int64_t hi = std::min(end, o * ps_old + LeanLength(g.orig, ps_old, o));
    if (lo < hi) rec.parts.push_back({sources[o], lo - o * ps_old, lo - begin, hi - lo});
  }
  const int64_t lean = LeanLength(g.orig, ps_new, r);
  if (lean < ps_new) rec.parts.push_back({-1, 0, lean, ps_new - lean});
  return rec;
}

PV::Ptr SliceMappings(const GroupSource& g, int64_t ps, int64_t r, const PV::Ptr& fragment_cls) {
  std::vector<std::pair<std::string, PV::Ptr>> entries;
  const int64_t left = r * ps;
  int64_t off = 0;
  for (const auto& [name, n] : g.params) {
    const int64_t lo = std::max(off, left), hi = std::min(off + n, left + ps);
    if (lo < hi) {
      PV frag;
      frag.kind = K::kObject;
      frag.callee = fragment_cls;
      frag.args = PickleTuple({});
      frag.state = PickleDict({{"numel", PickleInt(hi - lo)}, {"start", PickleInt(lo - left)}});
      entries.emplace_back(name, Node(std::move(frag)));
    }
    off += n;
  }
  return PickleOrderedDict(std::move(entries));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void AddZero3Parts(DsRecord& rec, int64_t numel, int64_t old_dp, int64_t new_dp, int64_t r,
                   const std::vector<int64_t>& sources, const std::vector<int64_t>& src_at,
                   int64_t dst_at) {
  const int64_t ps_old = CeilDiv(numel, old_dp), ps_new = CeilDiv(numel, new_dp);
  const int64_t begin = r * ps_new, real = std::clamp<int64_t>(numel - begin, 0, ps_new);
  for (int64_t o = 0; o < old_dp; ++o) {
    const int64_t lo = std::max(begin, o * ps_old);
    const int64_t hi = std::min(begin + real, o * ps_old + std::clamp<int64_t>(numel - o * ps_old, 0, ps_old));
    if (lo < hi) {
      rec.parts.push_back({sources[o], src_at[o] + lo - o * ps_old, dst_at + lo - begin, hi - lo});
    }
  }
  if (real < ps_new) rec.parts.push_back({-1, 0, dst_at + real, ps_new - real});
}

std::vector<size_t> SubGroupSplit(const std::vector<int64_t>& numels, int64_t dp, double size) {
  double total = 0;
  for (int64_t n : numels) total += static_cast<double>(CeilDiv(n, dp));
  if (size >= total) return {numels.size()};
  std::vector<size_t> out;
  size_t count = 0;
  double local = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    ++count;
    local += static_cast<double>(CeilDiv(numels[i], dp));
    if (local >= size || i + 1 == numels.size()) {
      out.push_back(count);
      count = 0;
      local = 0;
    }
  }
  return out;
}

DsRecord StreamRecord(DType dtype, int64_t elements, std::string name) {
  DsRecord rec;
  rec.kind = DsRecord::Kind::kStream;
  rec.dtype = dtype;
  rec.elements = elements;
  rec.bytes = static_cast<uint64_t>(elements) * DTypeSize(dtype);
  rec.name = std::move(name);
  return rec;
}

}  // namespace fc::deepspeed_writer_internal
