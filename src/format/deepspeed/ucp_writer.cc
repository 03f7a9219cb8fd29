// Universal Checkpoint files and the non-tensor part of a UCP. Contract:
// include/fc/format/ucp_writer.h; what ds_to_universal.py writes: shared/reference/deepspeed.md
// section 5.
//
// Why the archive layout is fixed at Create: a param file is one torch.save zip whose only
// variable parts are data.pkl (a function of the dict's keys, dtype and shape) and the
// storage record, so the executor's slabs are pwritten to their final place and Finish
// writes only the few hundred bytes around them. CRCs are combined from the slabs'
// (crc32_combine), as in the torch DCP writer: nothing is read back.
//
// Why generic values are re-pickled rather than copied: the optimizer state of a UCP is a
// subset of rank 0's optimizer state dict (5.3), and a UCP source's cat_dim / sub_param_shape
// keys are values inside a pickle that also holds the tensor; both are re-emitted from the
// parsed value tree (DeepSpeed's classes as the same GLOBAL / REDUCE / BUILD opcodes), so
// torch.load gives back the same objects. Nothing is executed.
#include "fc/format/ucp_writer.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_set>
#include <vector>

#include <re2/re2.h>

#include "fc/codec/pickle_build.h"
#include "fc/codec/pickle_reemit.h"
#include "fc/codec/pickle_walk.h"
#include "fc/codec/pickle_writer.h"
#include "fc/codec/zip_writer.h"
#include "fc/core/checked_math.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/deepspeed.h"
#include "src/format/deepspeed/names.h"
#include "src/format/deepspeed/parsed_files.h"
#include "fc/io/file.h"
#include "src/format/torch/torch_save_writer.h"

namespace fc {
namespace {

using internal_torch::Crc32;
using internal_torch::Crc32Combine;
using internal_torch::PickleWriter;
using internal_torch::TensorArchive;

constexpr std::string_view kByteOrder = "little";
constexpr std::string_view kVersion = "3\n";

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// CPython's dict pickling: one SETITEM for a single entry, else MARK ... SETITEMS.
Result<std::string> DictPickle(const UcpFileSpec& spec) {
  PickleWriter w(2);
  w.EmptyDict().Memoize();
  const size_t n = spec.meta.before.size() + 1 + spec.meta.after.size();
  if (n > 1) w.Mark();
  for (const auto& [k, v] : spec.meta.before) {
    w.Str(k).Memoize();
    FC_RETURN_IF_ERROR(EmitPickleValue(w, *v, spec.path + "['" + k + "']"));
  }
  w.Str("param").Memoize();
  internal_torch::EmitTensor(w, spec.dtype, spec.shape);
  for (const auto& [k, v] : spec.meta.after) {
    w.Str(k).Memoize();
    FC_RETURN_IF_ERROR(EmitPickleValue(w, *v, spec.path + "['" + k + "']"));
  }
  if (n > 1) {
    w.SetItems();
  } else {
    w.SetItem();
  }
  return w.Finish();
}

std::string ArchiveBytes(std::string pickle) {
  const internal_torch::ZipLayout zip = internal_torch::ComputeZipLayout({
      {"archive/data.pkl", pickle.size()},
      {"archive/byteorder", kByteOrder.size()},
      {"archive/version", kVersion.size()},
  });
  const std::string_view records[] = {pickle, kByteOrder, kVersion};
  uint32_t crcs[3];
  std::string out;
  for (size_t i = 0; i < 3; ++i) {
    crcs[i] = Crc32(0, AsBytes(records[i]));
    out += internal_torch::ZipLocalHeader(zip, i);
    out += records[i];
    out += internal_torch::ZipDataDescriptor(zip, i, crcs[i]);
  }
  return out + internal_torch::ZipDirectoryTail(zip, crcs);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Plain values.

bool HoldsTensor(const PickleValue& v) {
  // Iterative, each node once: the tree is a DAG (values shared through the memo), and a
  // hostile pickle of n nested pairs [x, x] would take 2^n steps walked per reference.
  std::unordered_set<const PickleValue*> seen = {&v};
  std::vector<const PickleValue*> stack = {&v};
  while (!stack.empty()) {
    const PickleValue* node = stack.back();
    stack.pop_back();
    if (node->kind == PickleValue::Kind::kPersId) return true;
    ForEachChild(*node, [&](const PickleValue* child) {
      if (seen.insert(child).second) stack.push_back(child);
    });
  }
  return false;
}

Result<std::string> PlainValueArchive(const PickleValue& value) {
  PickleWriter w(2);
  FC_RETURN_IF_ERROR(EmitPickleValue(w, value, "value"));
  return ArchiveBytes(w.Finish());
}

// ---------------------------------------------------------------------------------------
// The writer.

struct UcpWriter::FileState {
  UcpFileSpec spec;
  TensorArchive archive;
  std::unique_ptr<WritableFile> file;
  std::mutex mu;
  internal_torch::CrcParts ranges;  // the tensor bytes written, merged when touching
  std::atomic<uint64_t> bytes_on_file{0};  // tensor bytes whose WriteAt returned
  bool tail_written = false;               // under mu
};

// The archive's tail (its records' CRC known once every tensor byte is in). Called once all
// of them were written, by the writer of the last bytes, or by Finish.
Status UcpWriter::WriteTail(FileState& fs) {
  const uint64_t length = fs.archive.data_bytes();
  uint32_t crc = 0;
  {
    std::lock_guard<std::mutex> lock(fs.mu);
    if (fs.tail_written) return Status::Ok();
    if (length > 0) {
      if (fs.ranges.size() != 1 || fs.ranges.begin()->first != 0 ||
          fs.ranges.begin()->second.end != length) {
        return InternalError(fs.spec.path + ": not every tensor byte was written");
      }
      crc = fs.ranges.begin()->second.crc;
    }
    fs.tail_written = true;
  }
  return fs.file->WriteAt(fs.archive.data_offset() + length,
                          AsBytes(internal_torch::TensorArchiveTail(fs.archive, crc)));
}

UcpWriter::~UcpWriter() = default;

Result<std::unique_ptr<UcpWriter>> UcpWriter::Create(const std::string& dir,
                                                     std::vector<UcpFileSpec> files) {
  std::unique_ptr<UcpWriter> w(new UcpWriter());
  w->dir_ = dir;
  std::set<std::string> made;
  for (UcpFileSpec& spec : files) {
    // The path comes from param names in the source: it must stay inside `dir`.
    if (spec.path.empty() || spec.path.front() == '/' ||
        spec.path.find('\0') != std::string::npos) {
      return InvalidArgumentError("UCP file path '" + spec.path + "' is not relative");
    }
    for (size_t at = 0; at <= spec.path.size();) {
      const size_t end = std::min(spec.path.find('/', at), spec.path.size());
      const std::string_view part(spec.path.data() + at, end - at);
      if (part.empty() || part == "." || part == "..") {
        return InvalidArgumentError("UCP file path '" + spec.path +
                                    "' has an empty, '.' or '..' component");
      }
      at = end + 1;
    }
    auto state = std::make_unique<FileState>();
    std::optional<uint64_t> bytes = DTypeSize(spec.dtype);
    for (int64_t s : spec.shape) {
      if (bytes && s >= 0) bytes = CheckedMulU(*bytes, static_cast<uint64_t>(s));
      else bytes.reset();
    }
    if (!bytes) return OutOfRangeError(spec.path + ": tensor size overflows");
    std::string pickle;
    if (spec.meta.form == UcpFileForm::kRawTensor) {
      pickle = internal_torch::TensorPickle(spec.dtype, spec.shape);
    } else {
      FC_ASSIGN_OR_RETURN(pickle, DictPickle(spec));
    }
    state->archive = internal_torch::PlanArchiveWithPickle(std::move(pickle), *bytes);
    const std::string path = JoinPath(dir, spec.path);
    const std::string parent = Dirname(path);
    if (made.insert(parent).second) FC_RETURN_IF_ERROR(CreateDirectories(parent));
    FC_ASSIGN_OR_RETURN(state->file, WritableFile::Create(path));
    FC_RETURN_IF_ERROR(state->file->Reserve(state->archive.size()));
    FC_RETURN_IF_ERROR(
        state->file->WriteAt(0, AsBytes(internal_torch::TensorArchiveHead(state->archive))));
    state->spec = std::move(spec);
    w->files_.push_back(std::move(state));
  }
  return w;
}

Status UcpWriter::Write(size_t file, uint64_t offset, std::span<const std::byte> bytes) {
  if (file >= files_.size()) {
    return InvalidArgumentError(dir_ + ": UCP file index " + std::to_string(file) +
                                " out of range");
  }
  FileState& fs = *files_[file];
  const uint64_t length = fs.archive.data_bytes();
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes.size());
  if (!end || *end > length) {
    return InvalidArgumentError(fs.spec.path + ": tensor bytes [" + std::to_string(offset) +
                                ", +" + std::to_string(bytes.size()) + ") pass its end " +
                                std::to_string(length));
  }
  if (bytes.empty()) return Status::Ok();
  const uint32_t crc = Crc32(0, bytes);
  {
    std::lock_guard<std::mutex> lock(fs.mu);
    if (internal_torch::AddCrcPart(fs.ranges, offset, *end, crc)) {
      return InvalidArgumentError(fs.spec.path + ": tensor bytes at " + std::to_string(offset) +
                                  " written twice");
    }
  }
  FC_RETURN_IF_ERROR(fs.file->WriteAt(fs.archive.data_offset() + offset, bytes));
  // A UCP file is one tensor, a few MB, below the size at which the file starts its own
  // write-back: the writer of its last bytes finishes it and starts it toward the disk now,
  // so that the disk works while the copy goes on and Finish's fdatasync finds it written
  // (left to Finish, 8.6 GB of 1,360 files were still dirty at the end of the copy).
  if (fs.bytes_on_file.fetch_add(bytes.size()) + bytes.size() == length) {
    FC_RETURN_IF_ERROR(WriteTail(fs));
    fs.file->StartWriteBack();
  }
  return Status::Ok();
}

Status UcpWriter::Finish() {
  for (const std::unique_ptr<FileState>& f : files_) {
    FileState& fs = *f;
    FC_RETURN_IF_ERROR(WriteTail(fs));  // a file of no tensor bytes; or one not complete
    FC_RETURN_IF_ERROR(fs.file->Sync());
    FC_RETURN_IF_ERROR(fs.file->Close());
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// The source's non-tensor part.

namespace {

Result<PickleValue> ReadPickleOf(const std::string& path) {
  return ReadDeepSpeedPickle(path).With(path);
}

// The tag dir `latest` or `latest_universal` names (as the reader resolved it), else `input`.
Result<std::string> ResolveDir(const std::string& input) {
  for (const char* pointer : {"latest", "latest_universal"}) {
    FC_ASSIGN_OR_RETURN(std::optional<std::string> tag,
                        deepspeed_internal::LatestTag(input, pointer));
    if (tag) return JoinPath(input, *tag);
  }
  return input;
}

// Python re.match (anchored at the start only) of any pattern in the list `key` of `info`.
// Patterns RE2 cannot run were refused by the reader already.
bool AnyMatch(const PickleValue* info, std::string_view key, const std::string& name) {
  if (info == nullptr) return false;
  const PickleValue* list = info->Find(key);
  if (list == nullptr || (!list->is_list() && !list->is_tuple())) return false;
  for (const PickleValue::Ptr& p : list->items) {
    if (!p->is_str()) continue;
    RE2 re(p->str, RE2::Quiet);
    if (re.ok() && re.Match(name, 0, name.size(), RE2::ANCHOR_START, nullptr, 0)) return true;
  }
  return false;
}

PickleValue::Ptr Node(PickleValue v) { return std::make_shared<PickleValue>(std::move(v)); }

// The sub_param_shape ds_to_universal saves for a fused param (deepspeed.md 5.5 rule 4):
// SubparamShape(patterns, shape, partition_dim) of the first parameter_with_sub_params entry
// with a pattern matching `name`, its shape as in the entry, except that before version 0.4
// a count of equal sub-params at partition_dim becomes their sizes (from the merged size
// `merged` of that dim). nullptr when no entry matches.
Result<PickleValue::Ptr> SubParamShapeFor(const PickleValue* info, const std::string& name,
                                          const Shape& merged) {
  const PickleValue* list = info ? info->Find("parameter_with_sub_params") : nullptr;
  if (list == nullptr || (!list->is_list() && !list->is_tuple())) return PickleValue::Ptr();
  double version = 0;
  if (const PickleValue* v = info->Find("universal_checkpoint_version")) {
    if (v->kind == PickleValue::Kind::kFloat) version = v->float_value;
    else if (v->is_int()) version = static_cast<double>(v->int_value);
  }
  for (const PickleValue::Ptr& entry : list->items) {
    const PickleValue* fields = entry->is_dict() ? entry.get() : entry->state.get();
    const PickleValue* patterns = fields ? fields->Find("patterns") : nullptr;
    if (patterns == nullptr) continue;
    bool hit = false;
    for (const PickleValue::Ptr& p : patterns->items) {
      if (!p->is_str()) continue;
      RE2 re(p->str, RE2::Quiet);
      if (re.ok() && re.Match(name, 0, name.size(), RE2::ANCHOR_START, nullptr, 0)) hit = true;
      if (hit) break;
    }
    if (!hit) continue;
    const PickleValue* shape = fields->Find("shape");
    const PickleValue* pd = fields->Find("partition_dim");
    if (shape == nullptr || pd == nullptr || !pd->is_int() || pd->int_value < 0 ||
        static_cast<size_t>(pd->int_value) >= shape->items.size()) {
      return DataLossError("parameter_with_sub_params entry for '" + name + "' has no usable "
                           "shape / partition_dim");
    }
    const size_t d = static_cast<size_t>(pd->int_value);
    PickleValue::Ptr shape_out;
    for (const PickleValue::Ptr& x : shape->items) {
      if (x == nullptr) return DataLossError("parameter_with_sub_params shape of '" + name + "'");
    }
    if (version < 0.4 && shape->items[d]->is_int()) {
      const int64_t count = shape->items[d]->int_value;
      if (count <= 0 || d >= merged.size() || merged[d] % count != 0) {
        return DataLossError("'" + name + "': " + std::to_string(count) + " sub-params do not "
                             "divide its merged dim " + std::to_string(d));
      }
      PickleValue sizes;
      sizes.kind = PickleValue::Kind::kTuple;
      for (int64_t i = 0; i < count; ++i) sizes.items.push_back(PickleInt(merged[d] / count));
      PickleValue t;
      t.kind = PickleValue::Kind::kTuple;
      t.items = shape->items;
      t.items[d] = Node(std::move(sizes));
      shape_out = Node(std::move(t));
    } else {
      shape_out = std::make_shared<PickleValue>(*shape);
    }
    PickleValue obj;
    obj.kind = PickleValue::Kind::kObject;
    obj.callee = PickleGlobal("deepspeed.checkpoint.universal_checkpoint", "SubparamShape");
    obj.state = PickleDict({{"patterns", std::make_shared<PickleValue>(*patterns)},
                            {"shape", shape_out},
                            {"partition_dim", PickleInt(pd->int_value)}});
    return Node(std::move(obj));
  }
  return PickleValue::Ptr();
}

// zero/optimizer_state.pt of a ZeRO-3 source (see ReadUcpSource): `out` with entry
// `osd_at` (rank 0's optimizer_state_dict, `base`) replaced by {'state': {k: {'step': s}}
// for each sub-group k of base's state, 'param_groups': base's}. A step that is a tensor is
// the source's optimizer.step.<param> tensor (one value for every sub-group: DeepSpeed's
// loader gives every sub-group state[0]'s), the archive's one storage.
Result<std::string> Zero3OptimizerState(const PickleValue& out, size_t osd_at,
                                        const PickleValue& base, const CheckpointIndex& index,
                                        const std::vector<std::string>& params) {
  const PickleValue* state = base.Find("state");
  const PickleValue* groups = base.Find("param_groups");
  if (state == nullptr || !state->is_dict() || groups == nullptr) {
    return DataLossError("optimizer_state_dict['optimizer_state_dict'] has no state dict or "
                         "no param_groups");
  }
  const TensorEntry* step = nullptr;
  for (const std::string& p : params) {
    if ((step = index.FindTensor("optimizer.step." + p)) != nullptr) break;
  }
  PickleWriter w(2);
  bool tensor_step = false;
  w.EmptyDict().Memoize().Mark();
  for (size_t i = 0; i < out.entries.size(); ++i) {
    const auto& [k, v] = out.entries[i];
    FC_RETURN_IF_ERROR(EmitPickleValue(w, *k, "key"));
    if (i != osd_at) {
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *v, k->is_str() ? k->str : "value"));
      continue;
    }
    w.EmptyDict().Memoize().Mark();
    w.Str("state").Memoize();
    w.EmptyDict().Memoize().Mark();
    for (const auto& [sk, sv] : state->entries) {
      const PickleValue* s = sv->Find("step");
      if (s == nullptr) {
        return DataLossError("optimizer_state_dict['optimizer_state_dict']['state'][" +
                             sk->DebugString() + "] has no 'step'");
      }
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *sk, "state key"));
      w.EmptyDict().Memoize();
      w.Str("step").Memoize();
      if (HoldsTensor(*s)) {
        if (step == nullptr || step->global_shape.size() != 0 || step->chunks.size() != 1) {
          return DataLossError("the Adam step is a tensor, but fc found no 0-d "
                               "optimizer.step.<param> tensor holding it");
        }
        internal_torch::EmitTensor(w, step->dtype, step->global_shape);
        tensor_step = true;
      } else {
        FC_RETURN_IF_ERROR(EmitPickleValue(w, *s, "step"));
      }
      w.SetItem();
    }
    w.SetItems();
    w.Str("param_groups").Memoize();
    FC_RETURN_IF_ERROR(EmitPickleValue(w, *groups, "param_groups"));
    w.SetItems();
  }
  w.SetItems();
  std::string pickle = w.Finish();
  if (!tensor_step) return ArchiveBytes(std::move(pickle));
  const size_t bytes = DTypeSize(step->dtype);
  std::vector<std::byte> data(bytes);
  ChunkReader reader(index);
  const Box whole = Box::Whole(step->global_shape);
  FC_RETURN_IF_ERROR(reader.CopyChunkRegion(*step, step->chunks[0], whole, data.data(), whole));
  const TensorArchive archive = internal_torch::PlanArchiveWithPickle(std::move(pickle), bytes);
  std::string result = internal_torch::TensorArchiveHead(archive);
  result.append(reinterpret_cast<const char*>(data.data()), data.size());
  result += internal_torch::TensorArchiveTail(
      archive, Crc32(0, std::span<const std::byte>(data.data(), data.size())));
  return result;
}

// The parsed object of the source file dir/rel: the DeepSpeed reader's, kept in the index the
// caller opened (`parsed`, may be null), else read here.
Result<PickleValue> ParsedRoot(const deepspeed_internal::ParsedFiles* parsed,
                               const std::string& dir, const std::string& rel) {
  if (parsed != nullptr) {
    if (const DeepSpeedPtFile* pt = parsed->Find(dir, rel)) return pt->root;
  }
  return ReadPickleOf(JoinPath(dir, rel));
}

constexpr const char* kUcpStates[] = {"fp32", "exp_avg", "exp_avg_sq"};

// A UCP source: its optimizer_state.pt (copied) and each param file's non-tensor keys.
Status ReadUniversalMeta(const deepspeed_internal::ParsedFiles* parsed,
                         const std::vector<std::string>& params, UcpSource& src) {
  const std::string osd = JoinPath(src.dir, "zero/optimizer_state.pt");
  if (PathExists(osd)) src.optimizer_state_copy = osd;
  for (const std::string& p : params) {
    for (const char* state : kUcpStates) {
      FC_ASSIGN_OR_RETURN(PickleValue root,
                          ParsedRoot(parsed, src.dir, "zero/" + p + "/" + state + ".pt"));
      UcpFileMeta meta;
      if (root.is_dict()) {
        bool seen = false;
        for (const auto& [k, v] : root.entries) {
          if (!k->is_str()) continue;
          if (k->str == "param") {
            seen = true;
          } else {
            (seen ? meta.after : meta.before).emplace_back(k->str, v);
          }
        }
      } else {
        meta.form = UcpFileForm::kRawTensor;
      }
      src.meta[p + "/" + state] = std::move(meta);
    }
  }
  return Status::Ok();
}

// zero/optimizer_state.pt (5.3) from rank 0's optimizer file `optim` (at `optim_path`, for
// messages): its optimizer state dict without the flat partitions, plus param_groups.
// Entries holding tensors (stage 3's fp32_flat_groups and nested optimizer_state_dict) are
// left out: fc writes no tensor there.
Result<std::string> OptimizerStateArchive(const PickleValue& optim, const std::string& optim_path,
                                          bool zero3, const CheckpointIndex& index,
                                          const std::vector<std::string>& params) {
  const PickleValue* osd = optim.Find("optimizer_state_dict");
  if (osd == nullptr || !osd->is_dict()) {
    return DataLossError(optim_path + ": no optimizer_state_dict dict");
  }
  const PickleValue* base = osd->Find(zero3 ? "optimizer_state_dict" : "base_optimizer_state");
  const PickleValue* groups = base ? base->Find("param_groups") : nullptr;
  if (groups == nullptr) {
    return DataLossError(optim_path + ": no param_groups in " +
                         (zero3 ? "optimizer_state_dict" : "base_optimizer_state"));
  }
  PickleValue out;
  out.kind = PickleValue::Kind::kDict;
  // ZeRO-3: DeepSpeed's universal loader (stage3.py load_hp_checkpoint_state_from_checkpoint_
  // dir_stage3) reads optimizer_state_dict['state'][0]['step'] and
  // optimizer_state_dict['param_groups'][0]; ds_to_universal copies rank 0's whole
  // optimizer_state_dict there. fc keeps its place in the dict, its param_groups and each
  // sub-group state's 'step' (torch's Adam: a 0-d tensor, written with its bytes), and leaves
  // out rank 0's exp_avg / exp_avg_sq shards, which no loader reads.
  size_t zero3_osd_at = SIZE_MAX;
  for (const auto& [k, v] : osd->entries) {
    if (k->is_str() && (k->str == "base_optimizer_state" || k->str == "param_slice_mappings" ||
                        k->str == "single_partition_of_fp32_groups" || k->str == "param_groups")) {
      continue;
    }
    if (zero3 && k->is_str() && k->str == "optimizer_state_dict") {
      zero3_osd_at = out.entries.size();
      out.entries.emplace_back(k, v);
      continue;
    }
    if (HoldsTensor(*v)) continue;
    out.entries.emplace_back(k, v);
  }
  auto key = std::make_shared<PickleValue>();
  key->kind = PickleValue::Kind::kStr;
  key->str = "param_groups";
  out.entries.emplace_back(key, std::make_shared<PickleValue>(*groups));
  if (zero3_osd_at == SIZE_MAX) return PlainValueArchive(out).With(optim_path);
  return Zero3OptimizerState(out, zero3_osd_at, *base, index, params).With(optim_path);
}

// The merge keys of each param's files (5.5) from universal_checkpoint_info `info` of the
// model states at `model_path` (for messages) into src.meta.
Status AddMergeKeys(const PickleValue* info, const std::string& model_path,
                    const CheckpointIndex& index, const std::vector<std::string>& params,
                    bool zero3, UcpSource& src) {
  int64_t tp = 1;
  if (const std::string t = index.Attribute("deepspeed.tp_degree"); !t.empty()) tp = std::stoll(t);
  // DeepSpeed 0.19's AutoTP publishes, beside the category patterns, an `affine_map`: per
  // param pattern, where each TP rank's block lies in the full tensor. ds_to_universal then
  // rebuilds such a param from the map and saves none of the category keys (cat_dim,
  // param_n_sub_params, sub_param_shape), only vocab_tensor; a loader of an AutoTP model
  // takes the layout from its own params' maps. The values equal the category merge fc
  // reads (real_deepspeed_autotp), so only the keys follow the map here. Each pattern is
  // compiled once (AutoTP lists one per param).
  std::vector<std::unique_ptr<RE2>> affine_patterns;
  if (const PickleValue* am = info ? info->Find("affine_map") : nullptr; am && am->is_dict()) {
    if (const PickleValue* ps = am->Find("params"); ps && ps->is_dict()) {
      for (const auto& [k, v] : ps->entries) {
        if (k->is_str()) affine_patterns.push_back(std::make_unique<RE2>(k->str, RE2::Quiet));
      }
    }
  }
  auto affine_map_covers = [&](const std::string& name) {
    for (const auto& re : affine_patterns) {  // Python's re.match: anchored at the start
      if (re->ok() && re->Match(name, 0, name.size(), RE2::ANCHOR_START, nullptr, 0)) return true;
    }
    return false;
  };
  for (const std::string& p : params) {
    UcpFileMeta meta;
    if (zero3 && tp == 1) {
      meta.form = UcpFileForm::kRawTensor;
    } else if (!affine_map_covers(p) &&
               !AnyMatch(info, "tp_replicated_parameter_patterns", p) &&
               !AnyMatch(info, "parameter_to_average_patterns", p)) {
      const TensorEntry* merged = index.FindTensor(p);
      PickleValue::Ptr sub;
      if (!AnyMatch(info, "parameter_with_2_sub_params_cat_dim_0", p)) {
        FC_ASSIGN_OR_RETURN(sub, SubParamShapeFor(info, p, merged ? merged->global_shape : Shape{})
                                     .With(model_path));
      }
      if (AnyMatch(info, "parameter_with_2_sub_params_cat_dim_0", p)) {
        meta.before.emplace_back("cat_dim", PickleInt(0));
        meta.before.emplace_back("param_n_sub_params", PickleInt(2));
      } else if (sub != nullptr) {
        meta.before.emplace_back("sub_param_shape", sub);
      } else {
        const bool row = AnyMatch(info, "parameter_with_row_parallelism_patterns", p);
        meta.before.emplace_back("cat_dim", PickleInt(row ? 1 : 0));
      }
    }
    if (meta.form == UcpFileForm::kDict && AnyMatch(info, "vocabulary_parameter_patterns", p)) {
      meta.before.emplace_back("vocab_tensor", PickleBool(true));
    }
    for (const char* state : kUcpStates) src.meta[p + "/" + state] = meta;
  }
  return Status::Ok();
}

}  // namespace

Result<UcpSource> ReadUcpSource(const std::string& input, const CheckpointIndex& index,
                                const std::vector<std::string>& params) {
  UcpSource src;
  FC_ASSIGN_OR_RETURN(src.dir, ResolveDir(StripTrailingSlashes(input)));
  const deepspeed_internal::ParsedFiles* parsed = deepspeed_internal::ParsedFilesOf(index);
  const std::string optimizer = index.Attribute("deepspeed.optimizer");
  src.universal = optimizer == "universal";
  const bool zero3 = optimizer == "zero3";
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(src.dir));
  for (const std::string& n : names) {
    if (IsDirectory(JoinPath(src.dir, n)) || !n.ends_with("model_states.pt")) continue;
    // ds_to_universal copies mp* (stage <= 2) or every *model_states.pt (stage 3); the
    // pipeline layer files are copied too: their module weights are in no other file.
    if (n.find("_expert_") == std::string::npos) src.copy_files.push_back(n);
  }
  if (src.universal) {
    FC_RETURN_IF_ERROR(ReadUniversalMeta(parsed, params, src));
    return src;
  }

  // A DeepSpeed tag dir: universal_checkpoint_info from the first model states, the
  // optimizer state of DP rank 0 of model-parallel rank 0.
  std::string model_file, optim_file;
  for (const std::string& n : names) {
    if (model_file.empty() && n.ends_with("model_states.pt") &&
        (n.starts_with("mp_rank_00") || n.find("zero_pp_rank_0_mp_rank_00") != std::string::npos)) {
      model_file = n;
    }
    for (const char* prefix : {"", "bf16_", "fp16_"}) {
      if (n == std::string(prefix) + "zero_pp_rank_0_mp_rank_00_optim_states.pt") optim_file = n;
    }
  }
  if (model_file.empty() || optim_file.empty()) {
    return NotFoundError(src.dir + ": no " + (model_file.empty()
                                                  ? std::string("mp_rank_00 model states")
                                                  : std::string("zero_pp_rank_0_mp_rank_00 optimizer states")) +
                         " file to take the UCP's optimizer state and merge rules from");
  }
  FC_ASSIGN_OR_RETURN(PickleValue model, ParsedRoot(parsed, src.dir, model_file));
  FC_ASSIGN_OR_RETURN(PickleValue optim, ParsedRoot(parsed, src.dir, optim_file));
  const PickleValue* info = model.Find("universal_checkpoint_info");
  if (info != nullptr && info->is_none()) info = nullptr;
  FC_ASSIGN_OR_RETURN(src.optimizer_state_archive,
                      OptimizerStateArchive(optim, JoinPath(src.dir, optim_file), zero3, index,
                                            params));
  FC_RETURN_IF_ERROR(AddMergeKeys(info, JoinPath(src.dir, model_file), index, params, zero3, src));
  return src;
}

Result<UcpSource> SynthesizedUcpSource(const std::vector<std::pair<std::string, Shape>>& params,
                                       int64_t step, bool zero3) {
  UcpSource src;
  src.model_states_name =
      zero3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt";
  std::vector<std::pair<std::string, PickleValue::Ptr>> shapes;
  shapes.reserve(params.size());
  for (const auto& [name, shape] : params) {
    shapes.emplace_back(name, PickleTorchSize(shape));
    UcpFileMeta meta;
    if (zero3) {
      meta.form = UcpFileForm::kRawTensor;
    } else {
      meta.before.emplace_back("cat_dim", PickleInt(0));
    }
    for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      src.meta[name + "/" + state] = meta;
    }
  }
  const PickleValue::Ptr model = PickleDict({
      {"module", PickleOrderedDict({})},
      {"buffer_names", PickleList({})},
      {"param_shapes", PickleList({PickleOrderedDict(std::move(shapes))})},
      {"frozen_param_shapes", PickleNone()},
      {"shared_params", PickleDict({})},
      {"skipped_steps", PickleInt(0)},
      {"global_steps", PickleInt(step)},
      {"dp_world_size", PickleInt(1)},
      {"mp_world_size", PickleInt(1)},
      {"ds_version", PickleStr(kSynthesizedDsVersion)},
  });
  FC_ASSIGN_OR_RETURN(src.model_states_archive, PlainValueArchive(*model));
  PickleValue::Ptr optimizer;
  if (zero3) {
    // {0: {'step': step}}: the state of sub-group 0, an int key.
    PickleValue state;
    state.kind = PickleValue::Kind::kDict;
    state.entries.emplace_back(PickleInt(0), PickleDict({{"step", PickleInt(step)}}));
    optimizer = PickleDict({
        {"ds_version", PickleStr(kSynthesizedDsVersion)},
        {"optimizer_state_dict",
         PickleDict({{"state", std::make_shared<const PickleValue>(std::move(state))},
                     {"param_groups", PickleList({PickleDict({})})}})},
    });
  } else {
    optimizer = PickleDict({
        {"ds_version", PickleStr(kSynthesizedDsVersion)},
        {"param_groups", PickleList({})},
    });
  }
  FC_ASSIGN_OR_RETURN(src.optimizer_state_archive, PlainValueArchive(*optimizer));
  return src;
}

}  // namespace fc
