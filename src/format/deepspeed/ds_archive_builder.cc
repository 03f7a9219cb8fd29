// One output archive of the DeepSpeed writer. Contract: src/format/deepspeed/ds_archive_builder.h.
#include "src/format/deepspeed/ds_archive_builder.h"

#include <optional>
#include <utility>

#include "fc/codec/pickle_build.h"
#include "fc/codec/pickle_reemit.h"
#include "src/format/deepspeed/ds_tree_edit.h"

namespace fc::deepspeed_writer_internal {

using internal_torch::PickleWriter;

PV::Ptr ArchiveBuilder::NewTensor(DsRecord record, int64_t view, PV::Ptr storage_class) {
  PV::Ptr node = Node(PV());
  placeholders_[node.get()] = {spec_.records.size(), view, std::move(storage_class)};
  spec_.records.push_back(std::move(record));
  return node;
}

Result<DsArchiveSpec> ArchiveBuilder::Finish(const PV& root, const SourceFile& source) {
  PickleWriter w(2);
  PickleEmitHook hook = [&](PickleWriter& pw, const PV& v) -> std::optional<Status> {
    if (auto it = placeholders_.find(&v); it != placeholders_.end()) {
      EmitNewTensor(pw, it->second);
      return Status::Ok();
    }
    if (v.kind != K::kPersId) return std::nullopt;
    return EmitSourceStorage(pw, v, source);
  };
  FC_RETURN_IF_ERROR(EmitPickleValue(w, root, spec_.path, hook));
  spec_.pickle = w.Finish();
  return std::move(spec_);
}

void ArchiveBuilder::EmitNewTensor(PickleWriter& w, const Placeholder& p) {
  const DsRecord& r = spec_.records[p.record];
  w.Global("torch._utils", "_rebuild_tensor_v2");
  w.Mark();
  w.Mark();  // the persistent id
  w.Str("storage").Memoize();
  w.Global(p.storage_class->str, p.storage_class->name);
  w.Str(std::to_string(p.record)).Memoize();
  w.Str("cpu").Memoize();
  w.Int(r.elements);
  w.TupleOf(5).Memoize();
  w.BinPersId();
  w.Int(0);  // storage_offset
  w.Int(p.view).TupleOf(1).Memoize();
  w.Int(1).TupleOf(1).Memoize();
  w.Bool(false);  // requires_grad
  w.Global("collections", "OrderedDict").EmptyTuple().Reduce().Memoize();
  w.TupleOf(6).Memoize();
  w.Reduce().Memoize();
}

Status ArchiveBuilder::EmitSourceStorage(PickleWriter& w, const PV& v, const SourceFile& source) {
  const PV* pid = v.callee.get();
  // Legacy files add a sixth item, view_metadata (None); the zip form has five.
  if (pid == nullptr || !pid->is_tuple() || pid->items.size() < 5 || pid->items.size() > 6 ||
      !pid->items[2]->is_str() || (pid->items.size() == 6 && !pid->items[5]->is_none())) {
    return DataLossError(source.path + ": persistent id " + v.DebugString(80) +
                         " is not a torch storage");
  }
  const std::string& key = pid->items[2]->str;
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    FC_ASSIGN_OR_RETURN(auto rec, StorageRecord(source, key));
    DsRecord r;
    r.kind = DsRecord::Kind::kCopy;
    r.bytes = rec.second;
    r.copy_from = source.path;
    r.copy_offset = rec.first;
    it = keys_.emplace(key, spec_.records.size()).first;
    spec_.records.push_back(std::move(r));
  }
  PV copy = *pid;
  copy.items.resize(5);
  copy.items[2] = PickleStr(std::to_string(it->second));
  FC_RETURN_IF_ERROR(EmitPickleValue(w, copy, source.path));
  w.BinPersId();
  return Status::Ok();
}

}  // namespace fc::deepspeed_writer_internal
