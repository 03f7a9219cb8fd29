// One source .pt file of the DeepSpeed writer. Contract: src/format/deepspeed/ds_source_file.h.
#include "src/format/deepspeed/ds_source_file.h"

#include <optional>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/format/deepspeed.h"
#include "fc/io/file.h"

namespace fc::deepspeed_writer_internal {

using PV = PickleValue;
using K = PickleValue::Kind;

Result<SourceFile> OpenSource(const std::string& dir, const std::string& name) {
  SourceFile sf;
  sf.path = JoinPath(dir, name);
  FC_ASSIGN_OR_RETURN(static_cast<DeepSpeedPtFile&>(sf), ReadDeepSpeedPtFile(sf.path));
  return sf;
}

Result<SourceFile> SourceFiles::Open(const std::string& name) const {
  const DeepSpeedPtFile* pt = parsed_ ? parsed_->Find(dir_, name) : nullptr;
  if (pt == nullptr) return OpenSource(dir_, name);
  SourceFile sf;
  static_cast<DeepSpeedPtFile&>(sf) = *pt;  // the root shares the tree's (immutable) nodes
  sf.path = JoinPath(dir_, name);
  return sf;
}

Result<std::pair<uint64_t, uint64_t>> StorageRecord(const SourceFile& sf, const std::string& key) {
  auto it = sf.storages.find(key);
  if (it == sf.storages.end()) {
    return DataLossError(sf.path + ": storage '" + key + "' is not in the file (or compressed)");
  }
  const auto [offset, bytes] = it->second;
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes);
  if (!end || *end > sf.size) {
    return DataLossError(sf.path + ": storage '" + key + "' passes the file's end");
  }
  return it->second;
}

Result<int64_t> ShapeNumel(const PV& v, const std::string& where) {
  const PV* t = &v;
  if (v.kind == K::kCall && v.args && v.args->is_tuple() && v.args->items.size() == 1) {
    t = v.args->items[0].get();
  }
  if (!t->is_tuple() && !t->is_list()) {
    return DataLossError(where + ": shape " + v.DebugString(60) + " is not a torch.Size");
  }
  int64_t n = 1;
  for (const PV::Ptr& d : t->items) {
    if (!d->is_int() || d->int_value < 0) {
      return DataLossError(where + ": shape " + v.DebugString(60) + " has a bad extent");
    }
    auto m = CheckedMul(n, d->int_value);
    if (!m) return OutOfRangeError(where + ": shape " + v.DebugString(60) + " overflows");
    n = *m;
  }
  return n;
}

Result<Located> LocateTensor(const SourceFile& sf, const PV* v, const std::string& what) {
  if (v == nullptr) return DataLossError(sf.path + ": " + what + " is missing");
  auto ref = DecodeTorchTensor(*v);
  if (!ref.ok()) return ref.status().With(sf.path + ": " + what);
  if (ref->shape.size() != 1) {
    return DataLossError(sf.path + ": " + what + " has " + std::to_string(ref->shape.size()) +
                         " dimensions, a flat partition has 1");
  }
  FC_ASSIGN_OR_RETURN(auto rec, StorageRecord(sf, ref->storage_key));
  if (rec.second != ref->storage_bytes) {
    return DataLossError(sf.path + ": " + what + ": storage record holds " +
                         std::to_string(rec.second) + " bytes, the pickle says " +
                         std::to_string(ref->storage_bytes));
  }
  Located l;
  l.first = rec.first + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(ref->dtype);
  l.ref = std::move(*ref);
  return l;
}

namespace {

// StorageClassOf over the nodes not yet in `seen`: each node is looked into once, as the
// tree is a DAG (a hostile pickle sharing one value n levels deep would take 2^n steps).
Result<PV::Ptr> StorageClassOfUnseen(const PV& v, const std::string& where,
                                     std::unordered_set<const PV*>& seen) {
  if (!seen.insert(&v).second) return NotFoundError(where + ": no storage");
  if (v.kind == K::kPersId) {
    const PV* pid = v.callee.get();
    if (pid && pid->is_tuple() && pid->items.size() >= 5 && pid->items[1]->kind == K::kGlobal &&
        pid->items[1]->name.ends_with("Storage") && pid->items[1]->name != "UntypedStorage") {
      return pid->items[1];
    }
    return UnimplementedError(where + ": storage " + v.DebugString(80) +
                              " is not a typed torch storage");
  }
  for (const PV::Ptr& p : {v.callee, v.args}) {
    if (p) {
      auto r = StorageClassOfUnseen(*p, where, seen);
      if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
    }
  }
  for (const PV::Ptr& p : v.items) {
    auto r = StorageClassOfUnseen(*p, where, seen);
    if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
  }
  return NotFoundError(where + ": no storage");
}

}  // namespace

Result<PV::Ptr> StorageClassOf(const PV& v, const std::string& where) {
  std::unordered_set<const PV*> seen;
  return StorageClassOfUnseen(v, where, seen);
}

}  // namespace fc::deepspeed_writer_internal
