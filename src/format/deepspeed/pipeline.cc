// Pipeline layer files (PipelineModule): each layer's state dict per TP rank, named as
// PipelineModule names its params.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fc/codec/pickle_access.h"
#include "fc/core/checked_math.h"
#include "src/codec/json_util.h"
#include "src/format/deepspeed/reader.h"

namespace fc::deepspeed_internal {

using json_internal::ShapeText;

Status Reader::AddLayerFiles(const std::vector<std::pair<int64_t, const PtFile*>>& layers,
                             const std::set<std::string>& buffer_names,
                             const std::set<std::string>& known_params, Families* f) {
  // Trainable and frozen names the optimizer files know; a UCP's come from param_shapes
  // (known_params), its zero/<param> files being read later.
  std::set<std::string> params = known_params;
  for (Family i : {kWeights, kFrozen}) {
    for (const TensorEntry& t : f->tensors[i]) params.insert(t.key);
  }
  std::map<std::string, size_t> module_pos;
  std::set<std::string> buffers, others;
  for (const TensorEntry& t : f->tensors[kModule]) module_pos[t.key] = 0;
  for (const TensorEntry& t : f->tensors[kBuffers]) buffers.insert(t.key);
  for (const TensorEntry& t : f->tensors[kOther]) others.insert(t.key);
  for (const auto& [layer, file] : layers) {
    const PickleEntries* entries = PickleDictEntries(&file->root);
    if (entries == nullptr) {
      return DataLossError(file->name + ": holds " + file->root.DebugString() +
                           ", expected the layer's state dict");
    }
    for (const auto& [k, v] : *entries) {
      auto local = PickleStr(k.get());
      if (!local) return DataLossError(file->name + ": state dict key " + k->DebugString());
      if (v->is_none()) continue;
      // PipelineModule names a layer's params "<layer index>.<local name>"; a tied module
      // (TiedLayerSpec without forward_fn) is saved under every layer index using it, and
      // its params are named "tied_modules.<key>.<local name>".
      std::string name = std::to_string(layer) + "." + *local;
      if (!params.empty() && !params.count(name) && !buffer_names.count(name)) {
        std::string found;
        int hits = 0;
        for (const std::string& p : params) {
          if (!p.starts_with("tied_modules.") || !p.ends_with("." + *local)) continue;
          const std::string key = p.substr(13, p.size() - 13 - local->size() - 1);
          if (!key.empty() && key.find('.') == std::string::npos) {
            found = p;
            ++hits;
          }
        }
        if (hits == 1) name = found;
      }
      FC_ASSIGN_OR_RETURN(Located l, file->Locate(v.get(), "['" + *local + "']"));
      TensorEntry t;
      t.key = "module." + name;
      t.dtype = l.dtype;
      t.global_shape = l.shape;
      t.chunks.push_back(WholeChunk(l, file->index));
      if (auto it = module_pos.find(t.key); it != module_pos.end()) {
        // A tied module saved again by a later layer index: the first copy is kept.
        const TensorEntry& have = f->tensors[kModule][it->second];
        if (have.dtype != t.dtype || have.global_shape != t.global_shape) {
          return DataLossError(file->name + ": '" + *local + "' (" + name + ") is " +
                               std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                               ", an earlier layer file has " + std::string(DTypeName(have.dtype)) +
                               " " + ShapeText(have.global_shape));
        }
        continue;
      }
      module_pos[t.key] = f->tensors[kModule].size();
      if (module_dtype_.empty() && !buffer_names.count(name)) {
        module_dtype_ = std::string(DTypeName(l.dtype));
      }
      TensorEntry plain = t;
      plain.key = name;
      f->tensors[kModule].push_back(std::move(t));
      if (buffer_names.count(name)) {
        if (buffers.insert(name).second) f->tensors[kBuffers].push_back(std::move(plain));
      } else if (!params.count(name) && others.insert(name).second) {
        f->tensors[kOther].push_back(std::move(plain));
      }
    }
  }
  return Status::Ok();
}

}  // namespace fc::deepspeed_internal
