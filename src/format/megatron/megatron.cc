// ReadMegatronLegacyCheckpoint: Megatron-LM iter_NNNNNNN / release dirs -> CheckpointIndex.
// Layout, names, the TP table and the contract: include/fc/format/megatron.h; file facts:
// shared/reference/formats-recent.md ("Megatron legacy").
//
// Every rank file is a torch.save zip; its data.pkl is parsed into a value tree (nothing
// runs) and each state-dict tensor is located inside its storage record. The reader then
// renames (pipeline layer offsets, expert numbers), keeps one copy of what EP ranks and
// pipeline stages share, and merges the TP ranks by placing each rank's bytes at their
// offset in the global tensor: concatenation only moves a chunk's box; the SwiGLU split
// narrows a chunk to some rows of its piece (a byte offset, the strides unchanged). No
// tensor data is read or copied when opening.
#include "fc/format/megatron.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "fc/codec/pickle_globals.h"
#include "fc/core/checked_math.h"
#include "fc/core/dtype_convert.h"
#include "fc/format/file_names.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "src/format/megatron/distrib_optim_layout.h"

namespace fc {
namespace {

using PV = PickleValue;
using Entries = std::vector<std::pair<PV::Ptr, PV::Ptr>>;

constexpr uint64_t kMaxPickleBytes = uint64_t{256} << 20;
constexpr std::string_view kLatestFile = "latest_checkpointed_iteration.txt";
constexpr std::string_view kRankFile = "model_optim_rng.pt";
constexpr std::string_view kDistribOptimFile = "distrib_optim.pt";

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool ParseUint(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 12) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *out >= 0;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

std::string Join(const std::vector<std::string_view>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '.';
    out += parts[i];
  }
  return out;
}

// "mp_rank_TT[_PPP][_EEE]" -> its numbers (1 to 3), or empty when the name is another one.
std::vector<int64_t> RankNumbers(std::string_view n) {
  for (std::string_view pattern : {"mp_rank_#", "mp_rank_#_#", "mp_rank_#_#_#"}) {
    std::optional<NumberedName> m = MatchNumberedName(n, pattern);
    if (!m) continue;
    std::vector<int64_t> out;
    for (size_t i = 0; i < m->count; ++i) {
      if ((*m)[i] >= 1'000'000'000'000) return {};  // as ParseUint: 12 digits at most
      out.push_back(static_cast<int64_t>((*m)[i]));
    }
    return out;
  }
  return {};
}

bool HasRankDirs(const std::string& dir) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return false;
  for (const std::string& n : *names) {
    if (!RankNumbers(n).empty() && PathExists(dir + "/" + n + "/" + std::string(kRankFile))) {
      return true;
    }
  }
  return false;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' ||
                        s.back() == '\t')) {
    s.pop_back();
  }
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

// The dir named by <save>/latest_checkpointed_iteration.txt ("release" or a number), if
// that file exists.
Result<std::optional<std::string>> LatestIterationDir(const std::string& save) {
  const std::string latest = save + "/" + std::string(kLatestFile);
  if (!PathExists(latest) || IsDirectory(latest)) return std::optional<std::string>();
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
  const std::string text =
      Trim(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (text == "release") return std::optional<std::string>("release");
  int64_t iteration = 0;
  if (!ParseUint(text, &iteration)) {
    return DataLossError(latest + ": '" + text.substr(0, 64) +
                         "' is neither an iteration number nor \"release\"");
  }
  std::string digits = std::to_string(iteration);
  if (digits.size() < 7) digits.insert(0, 7 - digits.size(), '0');
  return std::optional<std::string>("iter_" + digits);
}

// --- Pickle values -----------------------------------------------------------------------

const Entries* DictEntries(const PV* v) {
  if (v == nullptr) return nullptr;
  if (v->kind == PV::Kind::kDict) return &v->entries;
  if (v->kind == PV::Kind::kCall || v->kind == PV::Kind::kObject) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && g->IsGlobal("collections", "OrderedDict")) return &v->entries;
  }
  return nullptr;
}

std::optional<int64_t> IntOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int()) return v->int_value;
  return std::nullopt;
}

std::optional<bool> BoolOf(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kBool) return std::nullopt;
  return v->bool_value;
}

// Python's repr of a float the way Megatron writes checkpoint_version (3.0 -> "3.0").
std::string FloatText(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// The allow-list: globals whose meaning fc knows; anything else is kept as an opaque node
// and reported in megatron.opaque_globals.
bool AllowedGlobal(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kAllowed = {
      {"collections", "OrderedDict"},
      {"torch", "Size"},
      {"torch", "device"},
      {"__builtin__", "set"}, {"builtins", "set"},
      {"__builtin__", "frozenset"}, {"builtins", "frozenset"},
      {"__builtin__", "bytes"}, {"builtins", "bytes"},
      // getattr(SomeEnum, 'member'): an Enum member pickled by Python >= 3.11; never called,
      // and the enum class itself is reported when it is not allowed.
      {"__builtin__", "getattr"}, {"builtins", "getattr"},
      {"argparse", "Namespace"},
      // Protocol 2 writes bytes objects (numpy RNG key arrays) as _codecs.encode(str, enc).
      {"_codecs", "encode"},
      {"numpy.core.multiarray", "_reconstruct"},
      {"numpy._core.multiarray", "_reconstruct"},
      {"numpy.core.multiarray", "scalar"},
      {"numpy._core.multiarray", "scalar"},
      {"numpy", "ndarray"},
      {"numpy", "dtype"},
  };
  if (kAllowed.count({module, name})) return true;
  if (module == "torch._utils" && name.starts_with("_rebuild_")) return true;
  if (module == "torch._tensor" && name == "_rebuild_from_type_v2") return true;
  if (module == "torch" && (name.ends_with("Storage") || name == "Tensor")) return true;
  if (module == "torch" && TorchDTypeFromName(name).ok()) return true;  // params_dtype
  return false;
}


// A value pickled by torch.save for a tensor: REDUCE of a torch rebuild function.
bool LooksLikeTensor(const PV& v) {
  const PV* g = v.CalleeGlobal();
  return v.kind == PV::Kind::kCall && g != nullptr &&
         (g->str == "torch._utils" || g->str == "torch._tensor");
}

// --- Rank files --------------------------------------------------------------------------

struct Located {
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;  // always set, in elements
  bool contiguous = true;
  uint64_t first = 0;  // absolute file offset of element (0, ..., 0)
  uint32_t file = 0;
  std::string where;  // "<file>: <name>" for messages
};

struct RankFile {
  int64_t tp = 0, pp = 0, ep = 0;
  std::string rel;  // relative to the iteration dir
  uint32_t index = 0;
  std::unique_ptr<RandomAccessFile> file;
  TorchSaveArchive archive;
  PickleValue root;

  Result<Located> Locate(const PV& v, const std::string& what) const {
    auto ref = DecodeTorchTensor(v);
    if (!ref.ok()) return ref.status().With(rel + ": " + what);
    const ZipEntry* e = archive.FindRecord("data/" + ref->storage_key);
    if (e == nullptr) {
      return DataLossError(rel + ": " + what + ": storage record 'data/" + ref->storage_key +
                           "' is missing");
    }
    if (e->method != 0) {
      return UnimplementedError(rel + ": " + what + ": storage record '" + e->name +
                                "' is compressed");
    }
    if (e->compressed_size != ref->storage_bytes) {
      return DataLossError(rel + ": " + what + ": storage record '" + e->name + "' has " +
                           std::to_string(e->compressed_size) + " bytes, data.pkl says " +
                           std::to_string(ref->storage_bytes));
    }
    if (e->data_exclusive_max() > file->size()) {
      return DataLossError(rel + ": " + what + ": storage record '" + e->name +
                           "' passes the end of the file");
    }
    Located l;
    l.dtype = ref->dtype;
    l.shape = ref->shape;
    l.strides = ref->strides;
    l.contiguous = ref->IsRowMajorContiguous();
    // In range: DecodeTorchTensor checked that the view fits the storage.
    l.first = e->data_offset + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(l.dtype);
    l.file = index;
    l.where = rel + ": " + what;
    return l;
  }
};

// The integral value of a one-element float32/float64/int64 tensor in `f` (torch Adam's
// per-param step), or nullopt.
std::optional<int64_t> ScalarStep(const RankFile& f, const PV& v) {
  auto l = f.Locate(v, "step");
  if (!l.ok()) return std::nullopt;
  for (int64_t d : l->shape) {
    if (d != 1) return std::nullopt;
  }
  std::byte b[8];
  const size_t size = DTypeSize(l->dtype);
  if (size > sizeof b || l->first + size > f.file->size() ||
      !f.file->ReadAt(l->first, std::span<std::byte>(b, size)).ok()) {
    return std::nullopt;
  }
  double x;
  if (l->dtype == DType::kFloat32) {
    float g;
    std::memcpy(&g, b, 4);
    x = g;
  } else if (l->dtype == DType::kFloat64) {
    std::memcpy(&x, b, 8);
  } else if (l->dtype == DType::kInt64) {
    int64_t i;
    std::memcpy(&i, b, 8);
    return i;
  } else {
    return std::nullopt;
  }
  if (!(x >= 0 && x < 9.0e15) || x != static_cast<double>(static_cast<int64_t>(x))) {
    return std::nullopt;
  }
  return static_cast<int64_t>(x);
}

// `state_dict`: the root must be a dict (model_optim_rng.pt); distrib_optim.pt may also be
// a list (a ChainedOptimizer's).
Result<std::unique_ptr<RankFile>> OpenRankFile(const std::string& dir, const std::string& rel,
                                               uint32_t index, bool state_dict = true) {
  auto rf = std::make_unique<RankFile>();
  rf->rel = rel;
  rf->index = index;
  FC_ASSIGN_OR_RETURN(rf->file, RandomAccessFile::Open(dir + "/" + rel));
  const RandomAccessFile* f = rf->file.get();
  ZipReadFn read = [f](uint64_t off, std::span<std::byte> dst) { return f->ReadAt(off, dst); };
  if (f->size() >= 2) {
    std::byte magic[2];
    FC_RETURN_IF_ERROR(f->ReadAt(0, magic));
    if (magic[0] == std::byte{0x80}) {
      return UnimplementedError(rel + ": a legacy (non-zip) torch.save file "
                                "(_use_new_zipfile_serialization=False); fc reads Megatron "
                                "checkpoints saved as torch.save zips (torch >= 1.6)");
    }
  }
  auto archive = ReadTorchSaveArchive(f->size(), read);
  if (!archive.ok()) return archive.status().With(rel);
  rf->archive = std::move(*archive);
  auto root = ReadTorchSavePickle(rf->archive, read, kMaxPickleBytes);
  if (!root.ok()) return root.status().With(rel);
  rf->root = std::move(*root);
  if (state_dict && DictEntries(&rf->root) == nullptr) {
    return DataLossError(rel + ": the saved object is " + rf->root.DebugString() +
                         ", expected Megatron's state dict (a dict with args, model, ...)");
  }
  return rf;
}

// args: an argparse.Namespace (NEWOBJ + BUILD of its __dict__) or a plain dict.
const PV* ArgsDict(const RankFile& f) {
  const PV* a = f.root.Find("args");
  if (a == nullptr) return nullptr;
  if (DictEntries(a) != nullptr) return a;
  const PV* g = a->CalleeGlobal();
  if (g != nullptr && g->IsGlobal("argparse", "Namespace") && a->state &&
      DictEntries(a->state.get()) != nullptr) {
    return a->state.get();
  }
  return nullptr;
}

// --- Names -------------------------------------------------------------------------------

// The role of a param in tensor parallelism (the built-in table of megatron.h).
enum class Role { kColumn, kRow, kReplicated, kUnknown };

struct RoleInfo {
  Role role = Role::kUnknown;
  bool gated = false;  // linear_fc1 / dense_h_to_4h: two halves per rank with SwiGLU
  size_t axis = 0;     // kColumn / kRow: the dim the ranks' pieces are concatenated along
};

RoleInfo RoleOf(std::string_view name) {
  const std::vector<std::string_view> parts = Split(name, '.');
  std::string_view param = parts.back();
  while (!param.empty() && param.back() >= '0' && param.back() <= '9') param.remove_suffix(1);
  const std::string_view module = parts.size() >= 2 ? parts[parts.size() - 2] : "";
  const std::string_view outer = parts.size() >= 3 ? parts[parts.size() - 3] : "";
  const bool weight = param == "weight", wb = weight || param == "bias";
  auto any = [](std::string_view m, std::initializer_list<std::string_view> set) {
    return std::find(set.begin(), set.end(), m) != set.end();
  };
  if (weight && any(module, {"word_embeddings", "output_layer"})) return {Role::kColumn, false};
  if (wb && any(module, {"linear_qkv", "query_key_value"})) return {Role::kColumn, false};
  if (wb && any(module, {"linear_fc1", "dense_h_to_4h"})) return {Role::kColumn, true};
  const bool attn_dense =
      module == "dense" && any(outer, {"self_attention", "inter_attention", "attention"});
  if (attn_dense || any(module, {"linear_proj", "linear_fc2", "dense_4h_to_h"})) {
    if (weight) return {Role::kRow, false, 1};
    if (param == "bias") return {Role::kReplicated, false};
    return {};
  }
  if (param == "layer_norm_weight" || param == "layer_norm_bias") return {Role::kReplicated, false};
  if (module.find("norm") != std::string_view::npos) return {Role::kReplicated, false};
  if (module == "router") return {Role::kReplicated, false};
  if (weight && module == "position_embeddings") return {Role::kReplicated, false};
  return {};
}

// Position of the local layer number in `parts` (the component after the first "layers").
std::optional<size_t> LayerComponent(const std::vector<std::string_view>& parts) {
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int64_t v = 0;
    if (parts[i] == "layers" && ParseUint(parts[i + 1], &v)) return i + 1;
  }
  return std::nullopt;
}

// The local expert number of an expert tensor: component index and, for a TEGroupedMLP
// param (weightI / biasI), the length of its non-digit stem.
struct ExpertPos {
  size_t component = 0;
  size_t stem = 0;  // 0: the whole component is the number (local_experts.I)
  int64_t local = 0;
};

std::optional<ExpertPos> ExpertOf(const std::vector<std::string_view>& parts) {
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int64_t v = 0;
    if (parts[i] == "local_experts" && ParseUint(parts[i + 1], &v)) return ExpertPos{i + 1, 0, v};
  }
  if (std::find(parts.begin(), parts.end(), "experts") == parts.end()) return std::nullopt;
  std::string_view last = parts.back();
  size_t stem = last.size();
  while (stem > 0 && last[stem - 1] >= '0' && last[stem - 1] <= '9') --stem;
  int64_t v = 0;
  if (stem == last.size() || stem == 0 || !ParseUint(last.substr(stem), &v)) return std::nullopt;
  const std::string_view s = last.substr(0, stem);
  if (s != "weight" && s != "bias") return std::nullopt;
  return ExpertPos{parts.size() - 1, stem, v};
}

// One state-dict tensor of one rank file.
struct Piece {
  std::string name;  // as saved (local layer and expert numbers)
  const PV* value = nullptr;
};

// Flattens a (possibly nested) state dict into tensors; counts what is skipped.
Status FlattenStateDict(const RankFile& f, const PV& dict, const std::string& prefix, int depth,
                        std::vector<Piece>* out, int64_t* skipped) {
  if (depth > 16) return DataLossError(f.rel + ": state dict nested deeper than 16 levels");
  for (const auto& [k, v] : *DictEntries(&dict)) {
    if (!k || !k->is_str() || !v) {
      ++*skipped;
      continue;
    }
    const std::string name = prefix.empty() ? k->str : prefix + "." + k->str;
    if (name.ends_with("._extra_state") || name == "_extra_state") {
      ++*skipped;
      continue;
    }
    if (LooksLikeTensor(*v)) {
      out->push_back(Piece{name, v.get()});
    } else if (DictEntries(v.get()) != nullptr) {
      FC_RETURN_IF_ERROR(FlattenStateDict(f, *v, name, depth + 1, out, skipped));
    } else {
      ++*skipped;
    }
  }
  return Status::Ok();
}

// --- distrib_optim.pt -------------------------------------------------------------------

// The value under integer key `key` of a dict (the file's buffer index), or nullptr.
const PV* FindIntKey(const PV& dict, int64_t key) {
  const Entries* entries = DictEntries(&dict);
  if (entries == nullptr) return nullptr;
  const PV* found = nullptr;
  for (const auto& [k, v] : *entries) {
    if (k && k->is_int() && k->int_value == key) found = v.get();
  }
  return found;
}

// A pickled torch dtype (GLOBAL torch.<name>), or nullopt.
std::optional<DType> TorchDTypeOf(const PV* v) {
  if (v == nullptr || v->kind != PV::Kind::kGlobal || v->str != "torch") return std::nullopt;
  auto d = TorchDTypeFromName(v->name);
  if (!d.ok()) return std::nullopt;
  return *d;
}

// File offset of the element at row-major position `flat` of a located tensor.
uint64_t ElementOffset(const Located& l, int64_t flat) {
  int64_t pos = 0;
  for (size_t d = l.shape.size(); d-- > 0;) {
    pos += (flat % l.shape[d]) * l.strides[d];
    flat /= l.shape[d];
  }
  return l.first + static_cast<uint64_t>(pos) * DTypeSize(l.dtype);
}

std::string Hex(uint64_t bits, size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = bytes * 2; i-- > 0;) s += kDigits[(bits >> (4 * i)) & 0xf];
  return s;
}

// Megatron copies the fp32 main params into the model params after every step (a cast,
// round to nearest even), so a param's saved model weight is its master weight in the
// model's dtype. Checks that on the first and last few elements of every param: a layout
// that puts any param at a wrong offset fails here. Two reads per file and param (the
// model's elements one by one when it is a strided view). kDataLoss names the param and
// values.
Status CheckMasterRoundsToModel(const RandomAccessFile& optim_file, const Located& master,
                                const RandomAccessFile& model_file, const Located& model,
                                const std::string& name) {
  constexpr int64_t kEnds = 4;
  FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(model.shape));
  if (n == 0) return Status::Ok();  // nothing to compare (and no element to address)
  const size_t item = DTypeSize(model.dtype);
  // [first, first + count) runs: the head, and the tail when it does not overlap it.
  std::vector<std::pair<int64_t, int64_t>> runs = {{0, std::min(n, kEnds)}};
  if (n > kEnds) runs.emplace_back(std::max(kEnds, n - kEnds), n - std::max(kEnds, n - kEnds));
  for (const auto& [first, count] : runs) {
    std::array<float, kEnds> m{};
    std::array<std::byte, kEnds * 8> got{}, want{};
    const size_t c = static_cast<size_t>(count);
    FC_RETURN_IF_ERROR(optim_file.ReadAt(master.first + static_cast<uint64_t>(first) * 4,
                                         std::as_writable_bytes(std::span(m.data(), c))));
    FC_RETURN_IF_ERROR(ConvertElements(m.data(), DType::kFloat32, want.data(), model.dtype, c));
    if (model.contiguous) {
      FC_RETURN_IF_ERROR(model_file.ReadAt(ElementOffset(model, first),
                                           std::span(got.data(), c * item)));
    } else {
      for (size_t i = 0; i < c; ++i) {
        FC_RETURN_IF_ERROR(model_file.ReadAt(ElementOffset(model, first + static_cast<int64_t>(i)),
                                             std::span(got.data() + i * item, item)));
      }
    }
    for (size_t i = 0; i < c; ++i) {
      const std::byte* g = got.data() + i * item;
      const std::byte* w = want.data() + i * item;
      if (std::memcmp(g, w, item) == 0) continue;
      float back = 0;
      if (m[i] != m[i] && ConvertElements(g, model.dtype, &back, DType::kFloat32, 1).ok() &&
          back != back) {
        continue;  // NaN in both
      }
      uint64_t gb = 0, wb = 0;
      std::memcpy(&gb, g, item);
      std::memcpy(&wb, w, item);
      return DataLossError("'" + name + "' element " + std::to_string(first + static_cast<int64_t>(i)) +
                           ": the fp32 value " + FloatText(m[i]) + " rounds to " +
                           Hex(wb, item) + ", the model holds " + Hex(gb, item));
    }
  }
  return Status::Ok();
}

// --- The reader --------------------------------------------------------------------------

struct Degrees {
  int64_t tp = 1, pp = 1, ep = 1;
};

class Reader {
 public:
  explicit Reader(MegatronReadOptions options) : options_(std::move(options)) {}
  Result<CheckpointIndex> Read(const std::string& path);

 private:
  Result<std::string> ResolveDir(const std::string& path);
  std::optional<int64_t> ArgInt(const char* key) const {
    return args_ ? IntOf(args_->Find(key)) : std::nullopt;
  }
  Status CheckDegree(const char* key, int64_t found, const std::string& what) const;
  Status MergeTp(const std::vector<std::string>& order,
                 const std::vector<std::map<std::string, Located>>& per_tp,
                 std::optional<bool> swiglu);

  // The TP role of `name` with the given TP rank 0 shape: the built-in table, or the
  // caller's rules (options_.tp_axis).
  Result<RoleInfo> TpRole(const std::string& name, const Located& l0) const;

  // distrib_optim.pt of every rank: fills optim_. An error says why the states are not
  // read (the model weights never depend on them).
  using Grid = std::map<std::tuple<int64_t, int64_t, int64_t>, const RankFile*>;  // p, e, t
  using Pieces = std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<Piece>>;
  Status ReadDistribOptim(const Grid& grid, const Pieces& pieces, const Degrees& deg,
                          int64_t vpp);
  Status ReadRankDistribOptim(const RankFile& model, const Pieces& pieces, int64_t p, int64_t e,
                              int64_t t, const Degrees& deg, int64_t vpp);
  // One optimizer's state (`state`, of file `f`) over the rank's dense or expert params:
  // of every model chunk, or (overlap_param_gather_with_optimizer_step: an optimizer per
  // chunk) of chunk `chunk` only.
  Status ReadOptimizerState(const RankFile& model, const RankFile& f, const PV& state,
                            const std::string& rel, bool experts, const Pieces& pieces,
                            int64_t p, int64_t e, int64_t t, const Degrees& deg, int64_t vpp,
                            std::optional<int64_t> chunk = std::nullopt);
  // The candidate layouts of model chunk v of stage p: what args say, both alignments.
  // `rank_numel`: the rank's parameter count (every chunk, dense and expert), which
  // args.ddp_num_buckets divides into the bucket size.
  Result<std::vector<BufferLayoutRule>> LayoutCandidates(int64_t p, int64_t v,
                                                         std::optional<int64_t> rank_numel) const;

  // The Float16 (non-distributed) optimizer's state in each model_optim_rng.pt: fills
  // optim_, or says why not.
  Status ReadFloat16Optimizer(const Grid& grid, const Pieces& pieces, int64_t vpp);
  // One optimizer's state dict `state` over the rank's params that `member` accepts;
  // records those `keep` accepts.
  Status ReadFloat16State(const RankFile& f, const PV& state, const std::string& rel,
                          const std::function<bool(const Piece&)>& member,
                          const std::function<bool(const Piece&)>& keep, const Pieces& pieces,
                          int64_t p, int64_t e, int64_t t, int64_t vpp);

  MegatronReadOptions options_;
  std::string dir_;
  CheckpointIndex index_;
  std::vector<std::unique_ptr<RankFile>> files_;
  const PV* args_ = nullptr;
  std::string args_file_;
  std::set<std::string> unmerged_;
  // (p, e, t, v, local name) -> the param's fp32 master weight, exp_avg, exp_avg_sq.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, std::string>, std::array<Located, 3>>
      optim_;
  std::set<std::string> optim_layouts_;  // the rules that matched, for the attribute
  std::set<std::string> frozen_;         // params no buffer holds (no optimizer state)
};

constexpr std::array<std::string_view, 3> kOptimRoles = {"fp32", "exp_avg", "exp_avg_sq"};
constexpr std::array<std::string_view, 3> kOptimKeys = {"param", "exp_avg", "exp_avg_sq"};

// The param an index name is about: <name> for optimizer.<role>.<name>.
std::string_view ParamNameOf(std::string_view name) {
  for (std::string_view role : kOptimRoles) {
    const std::string prefix = "optimizer." + std::string(role) + ".";
    if (name.starts_with(prefix)) return name.substr(prefix.size());
  }
  return name;
}

std::string RuleText(const BufferLayoutRule& r) {
  return "params aligned to " + std::to_string(r.param_alignment) + " elements, " +
         (r.bucket_size ? "buckets of " + std::to_string(*r.bucket_size) + " elements"
                        : std::string("one bucket")) +
         (r.shared_start_dp > 0 ? ", shared embedding padded for dp " +
                                      std::to_string(r.shared_start_dp) + " (Megatron-Core < 0.13.1)"
                                : std::string()) +
         (r.shared_own_bucket ? "" : ", no bucket of its own for a shared embedding");
}

Result<std::vector<BufferLayoutRule>> Reader::LayoutCandidates(
    int64_t p, int64_t v, std::optional<int64_t> rank_numel) const {
  std::vector<std::optional<int64_t>> sizes;
  const std::optional<bool> overlap = BoolOf(args_ ? args_->Find("overlap_grad_reduce") : nullptr);
  const std::optional<bool> with_step =
      BoolOf(args_ ? args_->Find("overlap_param_gather_with_optimizer_step") : nullptr);
  // Megatron disables bucketing without overlap_grad_reduce, after the first pipeline stage,
  // after the first model chunk, and with overlap_param_gather_with_optimizer_step.
  if (!overlap.value_or(false) || p > 0 || v > 0 || with_step.value_or(false)) {
    sizes.push_back(std::nullopt);
  } else if (auto b = ArgInt("ddp_bucket_size")) {
    sizes.push_back(*b);
  } else if (auto nb = ArgInt("ddp_num_buckets")) {
    // Megatron's get_model: bucket_size = the rank's parameter count // ddp_num_buckets.
    if (*nb <= 0 || !rank_numel) {
      return DataLossError(args_file_ + ": args.ddp_num_buckets " + std::to_string(*nb) +
                           " is not a count of buckets");
    }
    sizes.push_back(std::max<int64_t>(*rank_numel / *nb, 1));
  } else {
    // Megatron's default, max(40M, 1M x DP), with DP counted with or without context
    // parallelism depending on the version: both are tried.
    // (Degrees as saved in args, bounded so the products cannot overflow.)
    const int64_t dp = std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24);
    const int64_t cp = std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
    sizes.push_back(std::max<int64_t>(40000000, 1000000 * dp));
    if (cp > 1) sizes.push_back(std::max<int64_t>(40000000, 1000000 * dp * cp));
  }
  // Megatron-Core 0.8 - 0.13.0's shared embedding padding (distrib_optim_layout.h), for
  // the data-parallel sizes the buffer may have had: DP, DP x CP, over the distributed
  // optimizer instances.
  const int64_t dp = std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24);
  const int64_t cp = std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
  const int64_t instances =
      std::clamp<int64_t>(ArgInt("num_distributed_optimizer_instances").value_or(1), 1, 1 << 24);
  const bool busbw =
      BoolOf(args_ ? args_->Find("ddp_pad_buckets_for_high_nccl_busbw") : nullptr).value_or(false);
  std::set<int64_t> dps;
  for (int64_t d : {dp, dp * cp}) {
    dps.insert(d);
    if (d % instances == 0) dps.insert(d / instances);
  }
  std::vector<BufferLayoutRule> out;
  for (int64_t align : {64, 1}) {
    for (const auto& size : sizes) {
      out.push_back(BufferLayoutRule{align, size});
      if (align != 64) continue;  // the rule came with the alignment
      for (int64_t d : dps) {
        const int64_t unit = std::lcm(std::lcm(d, int64_t{128}), busbw ? int64_t{1} << 16 : 1);
        out.push_back(BufferLayoutRule{align, size, d, unit});
      }
    }
  }
  return out;
}

bool IsExpertPiece(const Piece& pc) { return ExpertOf(Split(pc.name, '.')).has_value(); }

// The word embedding and output layer weights (Megatron's is_embedding_or_output_parameter,
// and the params it marks shared_embedding when tied embeddings span a pipeline; pre-Core
// models name the last stage's copy word_embeddings_for_head).
bool IsEmbeddingOrOutput(std::string_view name) {
  return name.ends_with("word_embeddings.weight") || name.ends_with("output_layer.weight") ||
         name.ends_with("word_embeddings_for_head.weight");
}

std::optional<double> NumberOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->kind == PV::Kind::kFloat) return v->float_value;
  if (v->is_int()) return static_cast<double>(v->int_value);
  return std::nullopt;
}

// Megatron's FP32Optimizer.state_dict() is the torch optimizer's own: {state, param_groups}
// at the top, where the Float16 and distributed optimizers nest it under "optimizer".
bool IsFp32OptimizerState(const PV& opt) {
  return opt.Find("state") != nullptr && opt.Find("param_groups") != nullptr &&
         opt.Find("optimizer") == nullptr && opt.Find("fp32_from_fp16_params") == nullptr;
}

Status Reader::ReadFloat16Optimizer(const Grid& grid, const Pieces& pieces, int64_t vpp) {
  for (const auto& [pet, f] : grid) {
    const auto [p, e, t] = pet;
    const PV* opt = f->root.Find("optimizer");
    const std::string rel = f->rel + ": optimizer";
    if (opt == nullptr) return DataLossError(f->rel + ": no 'optimizer'");
    bool has_experts = false;
    for (int64_t v = 0; v < vpp; ++v) {
      for (const Piece& pc : pieces.at({p, e, t, v})) has_experts |= IsExpertPiece(pc);
    }
    auto all = [](const Piece&) { return true; };
    auto dense_only = [](const Piece& pc) { return !IsExpertPiece(pc); };
    // EP rank 0 keeps the dense params' states; the other EP ranks their experts'.
    const bool ep_rank0 = e == 0;  // (a lambda cannot capture a structured binding in clang < 16)
    auto keep = [ep_rank0](const Piece& pc) { return ep_rank0 || IsExpertPiece(pc); };
    if (opt->is_list()) {
      // A ChainedOptimizer: [dense, expert] (expert parallelism puts the experts apart).
      if (opt->items.size() != (has_experts ? 2u : 1u) ||
          std::any_of(opt->items.begin(), opt->items.end(), [](const auto& i) { return !i; })) {
        return UnimplementedError(rel + " holds " + std::to_string(opt->items.size()) +
                                  " optimizers; fc reads a dense one and, with experts, an "
                                  "expert one");
      }
      if (e == 0) {
        FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt->items[0], rel + "[0]", dense_only,
                                            dense_only, pieces, p, e, t, vpp));
      }
      if (has_experts) {
        FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt->items[1], rel + "[1]", IsExpertPiece,
                                            IsExpertPiece, pieces, p, e, t, vpp));
      }
    } else {
      FC_RETURN_IF_ERROR(ReadFloat16State(*f, *opt, rel, all, keep, pieces, p, e, t, vpp));
    }
  }
  return Status::Ok();
}

// Megatron's param groups (megatron/core/optimizer _get_param_groups): trainable params in
// named_parameters order over the model chunks, a group per (wd_mult, lr_mult,
// is_expert_parallel, is_decoupled_lr); no weight decay for ".bias" and 1-D params. The
// saved groups keep those keys (the oldest: two groups, weight decay first), so each param's
// group is the one whose keys match; group order does not matter. Indices into `state` are
// the groups' `params` lists; fp32_from_fp16_params[g] lists the group's 16-bit params'
// master weights in order. Checked: group sizes, shapes, and every master rounding to its
// model weight at both ends. The FP32Optimizer (training in fp32, no --fp16/--bf16) saves
// the torch optimizer's state dict itself, {state, param_groups}: every param is fp32 and
// its own master.
Status Reader::ReadFloat16State(const RankFile& f, const PV& state, const std::string& rel,
                                const std::function<bool(const Piece&)>& member,
                                const std::function<bool(const Piece&)>& keep,
                                const Pieces& pieces, int64_t p, int64_t e, int64_t t,
                                int64_t vpp) {
  const bool fp32_optimizer = IsFp32OptimizerState(state);
  const PV* inner = fp32_optimizer ? &state : state.Find("optimizer");
  const PV* masters = state.Find("fp32_from_fp16_params");
  const PV* groups = inner ? inner->Find("param_groups") : nullptr;
  const PV* states = inner ? inner->Find("state") : nullptr;
  if ((!fp32_optimizer && (masters == nullptr || !masters->is_list())) || groups == nullptr ||
      !groups->is_list() || DictEntries(states) == nullptr) {
    return UnimplementedError(rel + " is not a Float16 optimizer's state ({optimizer: "
                              "{state, param_groups}, fp32_from_fp16_params}) nor an "
                              "FP32Optimizer's ({state, param_groups})");
  }
  if (!fp32_optimizer && masters->items.size() != groups->items.size()) {
    return DataLossError(rel + ": " + std::to_string(masters->items.size()) +
                         " fp32_from_fp16_params lists for " +
                         std::to_string(groups->items.size()) + " param groups");
  }
  struct Member {
    const Piece* piece;
    int64_t v;
    Located model;
  };
  // Each group's kind from its keys.
  struct Kind {
    std::optional<bool> no_wd, expert, decoupled;
  };
  std::vector<Kind> kinds;
  bool decoupled_used = false;
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const PV* grp = groups->items[g].get();
    if (grp == nullptr || DictEntries(grp) == nullptr) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " is not a dict");
    }
    Kind k;
    if (auto lr = NumberOf(grp->Find("lr_mult")); lr && *lr != 1.0) {
      return UnimplementedError(rel + ": param group " + std::to_string(g) + " has lr_mult " +
                                std::to_string(*lr) + " (scale_lr_cond: which params it holds "
                                "is not recorded)");
    }
    if (auto wd = NumberOf(grp->Find("wd_mult"))) {
      k.no_wd = *wd == 0.0;
    } else if (groups->items.size() == 2) {
      k.no_wd = g == 1;  // the oldest form: [weight decay, no weight decay]
    } else {
      return UnimplementedError(rel + ": param group " + std::to_string(g) + " has no wd_mult");
    }
    k.expert = BoolOf(grp->Find("is_expert_parallel"));
    k.decoupled = BoolOf(grp->Find("is_decoupled_lr"));
    decoupled_used |= k.decoupled.value_or(false);
    kinds.push_back(k);
  }
  std::vector<std::vector<Member>> members(kinds.size());
  for (int64_t v = 0; v < vpp; ++v) {
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      if (!member(pc)) continue;
      FC_ASSIGN_OR_RETURN(Located l, f.Locate(*pc.value, "'" + pc.name + "'"));
      const bool no_wd = pc.name.ends_with(".bias") || l.shape.size() == 1;
      const bool expert = IsExpertPiece(pc);
      const bool embedding = IsEmbeddingOrOutput(pc.name);
      std::optional<size_t> group;
      for (size_t g = 0; g < kinds.size(); ++g) {
        const Kind& k = kinds[g];
        if (*k.no_wd != no_wd || (k.expert && *k.expert != expert) ||
            (decoupled_used && k.decoupled.value_or(false) != embedding)) {
          continue;
        }
        if (group) {
          return UnimplementedError(rel + ": param groups " + std::to_string(*group) + " and " +
                                    std::to_string(g) + " both fit '" + pc.name + "'");
        }
        group = g;
      }
      if (!group) return DataLossError(rel + ": no param group fits '" + pc.name + "'");
      members[*group].push_back(Member{&pc, v, std::move(l)});
    }
  }
  std::set<int64_t> used_ids;
  for (size_t g = 0; g < kinds.size(); ++g) {
    const PV* ids_value = groups->items[g]->Find("params");
    const PV* fp32 = fp32_optimizer ? nullptr : masters->items[g].get();
    if (ids_value == nullptr || (!fp32_optimizer && fp32 == nullptr)) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " has no params list");
    }
    const PV& ids = *ids_value;
    if (!ids.is_list() || ids.items.size() != members[g].size()) {
      return DataLossError(rel + ": param group " + std::to_string(g) + " holds " +
                           (ids.is_list() ? std::to_string(ids.items.size()) : std::string("no")) +
                           " params, the model " + std::to_string(members[g].size()) +
                           " of its kind (frozen params, or another grouping rule)");
    }
    size_t next_master = 0;
    for (size_t i = 0; i < members[g].size(); ++i) {
      const Member& m = members[g][i];
      const std::string& name = m.piece->name;
      std::array<Located, 3> located;
      if (m.model.dtype == DType::kFloat32) {
        located[0] = m.model;  // an fp32 param is its own master
      } else if (fp32_optimizer) {
        return DataLossError(rel + ": an FP32Optimizer's state ({state, param_groups}, no "
                             "fp32_from_fp16_params), but '" + name + "' is " +
                             std::string(DTypeName(m.model.dtype)));
      } else {
        if (!fp32->is_list() || next_master >= fp32->items.size() || !fp32->items[next_master]) {
          return DataLossError(rel + ": fp32_from_fp16_params[" + std::to_string(g) +
                               "] has no entry for '" + name + "'");
        }
        FC_ASSIGN_OR_RETURN(located[0], f.Locate(*fp32->items[next_master++],
                                                 "fp32 master of '" + name + "'"));
      }
      const std::optional<int64_t> id = ids.items[i] ? IntOf(ids.items[i].get()) : std::nullopt;
      if (id && !used_ids.insert(*id).second) {
        return DataLossError(rel + ": state " + std::to_string(*id) + " is listed twice in the "
                             "param groups");
      }
      const PV* st = id ? FindIntKey(*states, *id) : nullptr;
      if (st == nullptr) {
        return UnimplementedError(rel + ": no Adam state for '" + name + "' (param " +
                                  (id ? std::to_string(*id) : std::string("?")) +
                                  "; a param without a gradient yet)");
      }
      for (size_t r = 1; r < 3; ++r) {
        const PV* tensor = st->Find(kOptimKeys[r]);
        if (tensor == nullptr || !LooksLikeTensor(*tensor)) {
          return DataLossError(rel + ": state of '" + name + "' has no " + std::string(kOptimKeys[r]));
        }
        FC_ASSIGN_OR_RETURN(located[r], f.Locate(*tensor, std::string(kOptimRoles[r]) + " of '" +
                                                              name + "'"));
      }
      for (const Located& l : located) {
        if (l.dtype != DType::kFloat32 || l.shape != m.model.shape) {
          return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                               ShapeText(l.shape) + ", the param " + ShapeText(m.model.shape) +
                               " (expected float32 of its shape)");
        }
      }
      if (m.model.dtype != DType::kFloat32) {  // an fp32 param is its own master
        // (The rounding check reads the master as contiguous.)
        if (!located[0].contiguous) {
          return UnimplementedError(located[0].where + " is a strided view");
        }
        FC_RETURN_IF_ERROR(CheckMasterRoundsToModel(*f.file, located[0], *f.file, m.model, name)
                               .With(rel));
      }
      if (keep(*m.piece)) optim_[{p, e, t, m.v, name}] = std::move(located);
    }
    if (fp32 != nullptr && fp32->is_list() && next_master != fp32->items.size()) {
      return DataLossError(rel + ": fp32_from_fp16_params[" + std::to_string(g) + "] has " +
                           std::to_string(fp32->items.size()) + " entries, the group " +
                           std::to_string(next_master) + " 16-bit params");
    }
  }
  return Status::Ok();
}

Status Reader::ReadDistribOptim(const Grid& grid, const Pieces& pieces, const Degrees& deg,
                                int64_t vpp) {
  for (const auto& [pet, f] : grid) {
    const auto [p, e, t] = pet;
    FC_RETURN_IF_ERROR(ReadRankDistribOptim(*f, pieces, p, e, t, deg, vpp));
  }
  return Status::Ok();
}

Status Reader::ReadRankDistribOptim(const RankFile& model, const Pieces& pieces, int64_t p,
                                    int64_t e, int64_t t, const Degrees& deg, int64_t vpp) {
  const std::string rank_dir = model.rel.substr(0, model.rel.find('/'));
  const std::string rel = rank_dir + "/" + std::string(kDistribOptimFile);
  if (!PathExists(dir_ + "/" + rel)) {
    return NotFoundError(rel + " is missing (other ranks have theirs)");
  }
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> f,
                      OpenRankFile(dir_, rel, static_cast<uint32_t>(files_.size()), false));
  bool has_experts = false;
  for (int64_t v = 0; v < vpp && !has_experts; ++v) {
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      has_experts |= IsExpertPiece(pc);
    }
  }
  // A ChainedOptimizer saves a list, one entry per optimizer (None where this process is not
  // DP rank 0 of that optimizer's group): [dense] or, with MoE, [dense, expert]; with
  // overlap_param_gather_with_optimizer_step and virtual pipeline chunks, a dense optimizer
  // per chunk ([chunk 0, chunk 1, ..., expert]); a lone optimizer saves its dict.
  std::vector<const PV*> dense = {&f->root};
  const PV* expert = nullptr;
  if (f->root.is_list()) {
    const auto& items = f->root.items;
    const size_t extra = has_experts ? 1 : 0;
    const bool per_chunk =
        vpp > 1 && items.size() == static_cast<size_t>(vpp) + extra &&
        BoolOf(args_ ? args_->Find("overlap_param_gather_with_optimizer_step") : nullptr)
            .value_or(false);
    if (items.size() != 1 + extra && !per_chunk) {
      return UnimplementedError(rel + " holds " + std::to_string(items.size()) +
                                " optimizers (a ChainedOptimizer); fc reads " +
                                (has_experts ? "two (dense, expert)" : "one") +
                                " for this rank's params, or one per model chunk (+ expert) "
                                "with overlap_param_gather_with_optimizer_step");
    }
    dense.clear();
    for (size_t k = 0; k + extra < items.size(); ++k) {
      dense.push_back(items[k] && !items[k]->is_none() ? items[k].get() : nullptr);
    }
    expert = has_experts && items.back() && !items.back()->is_none() ? items.back().get()
                                                                     : nullptr;
  } else if (has_experts) {
    return DataLossError(rel + " holds one optimizer, but " + model.rel +
                         " has expert params (a separate optimizer's)");
  }
  // Dense params are read from EP rank 0 only (the other EP ranks' copies are not used).
  if (e == 0) {
    for (size_t k = 0; k < dense.size(); ++k) {
      const std::string which =
          dense.size() > 1 ? rel + " (model chunk " + std::to_string(k) + " optimizer)" : rel;
      if (dense[k] == nullptr) return DataLossError(which + ": no state for the dense params");
      const std::optional<int64_t> chunk =
          dense.size() > 1 ? std::optional<int64_t>(static_cast<int64_t>(k)) : std::nullopt;
      FC_RETURN_IF_ERROR(ReadOptimizerState(model, *f, *dense[k], which, false, pieces, p, e, t,
                                            deg, vpp, chunk));
    }
  }
  if (has_experts) {
    if (expert == nullptr) return DataLossError(rel + ": no state for the expert params");
    FC_RETURN_IF_ERROR(ReadOptimizerState(model, *f, *expert, rel + " (expert optimizer)", true,
                                          pieces, p, e, t, deg, vpp));
  }
  files_.push_back(std::move(f));
  index_.files.push_back(FileInfo{files_.back()->rel, files_.back()->file->size()});
  return Status::Ok();
}

Status Reader::ReadOptimizerState(const RankFile& model, const RankFile& f, const PV& state,
                                  const std::string& rel, bool experts, const Pieces& pieces,
                                  int64_t p, int64_t e, int64_t t, const Degrees& deg,
                                  int64_t vpp, std::optional<int64_t> chunk) {
  const PV* root = &state;
  if (DictEntries(root) == nullptr) {
    return DataLossError(rel + ": the saved object is " + root->DebugString() +
                         ", expected the distributed optimizer's parameter state");
  }
  // The form (distrib_optim_layout.h): coalesced (Megatron-Core since February 2024),
  // per-bucket lists (Megatron-Core 0.4 and 0.5, "per_bucket_numel"), or one padded tensor
  // per state (Megatron-LM before buckets: int keys only).
  enum class Form { kCoalesced, kPerBucket, kWhole };
  const PV* per_bucket_numel = root->Find("per_bucket_numel");
  Form form = Form::kWhole;
  if (BoolOf(root->Find("buckets_coalesced")).value_or(false)) {
    form = Form::kCoalesced;
  } else if (per_bucket_numel != nullptr) {
    form = Form::kPerBucket;
  } else {
    for (const auto& [k, v] : *DictEntries(root)) {
      if (!k || !k->is_int()) {
        return UnimplementedError(rel + ": key " + (k ? k->DebugString() : std::string("?")) +
                                  " and neither 'buckets_coalesced' nor 'per_bucket_numel': a "
                                  "form of the distributed optimizer's state fc does not know");
      }
    }
  }
  const char* form_text = form == Form::kCoalesced ? ""
                          : form == Form::kPerBucket
                              ? "per-bucket tensors (Megatron-Core 0.4-0.5), "
                              : "one padded buffer per state (Megatron-LM before buckets), ";
  // The padding the older forms add (to a multiple of the data-parallel size, with or
  // without context parallelism) is less than this.
  const int64_t max_padding =
      std::clamp<int64_t>(ArgInt("data_parallel_size").value_or(1), 1, 1 << 24) *
      std::clamp<int64_t>(ArgInt("context_parallel_size").value_or(1), 1, 1 << 24);
  // The rank's buffers: each model chunk's params grouped by dtype (first seen first).
  struct Buffer {
    int64_t v = 0;
    DType dtype = DType::kFloat32;
    std::vector<const Piece*> params;
    std::vector<Located> located;
  };
  std::vector<Buffer> buffers;
  for (int64_t v = 0; v < vpp; ++v) {
    if (chunk && v != *chunk) continue;
    const size_t first = buffers.size();
    for (const Piece& pc : pieces.at({p, e, t, v})) {
      if (IsExpertPiece(pc) != experts) continue;
      FC_ASSIGN_OR_RETURN(Located l, model.Locate(*pc.value, "'" + pc.name + "'"));
      size_t b = first;
      while (b < buffers.size() && buffers[b].dtype != l.dtype) ++b;
      if (b == buffers.size()) buffers.push_back(Buffer{v, l.dtype, {}, {}});
      buffers[b].params.push_back(&pc);
      buffers[b].located.push_back(std::move(l));
    }
  }
  int64_t saved_buffers = 0;
  for (const auto& [k, v] : *DictEntries(root)) {
    if (k && k->is_int()) ++saved_buffers;
  }
  if (saved_buffers != static_cast<int64_t>(buffers.size())) {
    return DataLossError(rel + " holds " + std::to_string(saved_buffers) + " buffers; the " +
                         (chunk ? std::string("model chunk") : std::to_string(vpp) + " model chunk(s)") +
                         " of " + model.rel + " make " + std::to_string(buffers.size()) +
                         " (one per chunk and dtype)");
  }
  std::optional<int64_t> rank_numel;  // for args.ddp_num_buckets (LayoutCandidates)
  if (ArgInt("ddp_num_buckets")) {
    int64_t total = 0;
    for (int64_t v = 0; v < vpp; ++v) {
      for (const Piece& pc : pieces.at({p, e, t, v})) {
        FC_ASSIGN_OR_RETURN(Located l, model.Locate(*pc.value, "'" + pc.name + "'"));
        FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(l.shape));
        const std::optional<int64_t> sum = CheckedAdd(total, n);
        if (!sum) return OutOfRangeError(model.rel + ": parameter count overflows");
        total = *sum;
      }
    }
    rank_numel = total;
  }
  const std::optional<bool> untie =
      BoolOf(args_ ? args_->Find("untie_embeddings_and_output_weights") : nullptr);
  const bool shared_embeddings = deg.pp > 1 && !untie.value_or(false);
  for (size_t g = 0; g < buffers.size(); ++g) {
    Buffer& b = buffers[g];
    const std::string where = rel + " buffer " + std::to_string(g);
    const PV* by_dtype = FindIntKey(*root, static_cast<int64_t>(g));
    const Entries* entries = DictEntries(by_dtype);
    if (entries == nullptr || entries->size() != 1 || !(*entries)[0].first ||
        !(*entries)[0].second) {
      return DataLossError(where + ": expected {dtype: states}, found " +
                           (by_dtype ? by_dtype->DebugString() : std::string("nothing")));
    }
    // The key: (param dtype, grad dtype), or (older) the grad dtype alone.
    const PV& dkey = *(*entries)[0].first;
    const PV* param_dtype = dkey.is_tuple() && dkey.items.size() == 2 ? dkey.items[0].get() : nullptr;
    if (param_dtype != nullptr && TorchDTypeOf(param_dtype) != b.dtype) {
      return DataLossError(where + " is for " + dkey.DebugString() + " params, the model chunk's are " +
                           std::string(DTypeName(b.dtype)));
    }
    if (param_dtype == nullptr && !TorchDTypeOf(&dkey)) {
      return DataLossError(where + ": unexpected key " + dkey.DebugString());
    }
    const PV& states = *(*entries)[0].second;
    std::optional<int64_t> numel;  // the coalesced form's length
    if (form == Form::kCoalesced) {
      numel = IntOf(states.Find("numel_unpadded"));
      if (!numel || *numel < 0) return DataLossError(where + ": no numel_unpadded");
    }
    // Per state, its tensors: one per bucket in the per-bucket form, else one.
    std::array<std::vector<Located>, 3> flat;
    for (size_t r = 0; r < 3; ++r) {
      const PV* value = states.Find(kOptimKeys[r]);
      std::vector<const PV*> tensors;
      if (form == Form::kPerBucket && value != nullptr && value->is_list()) {
        for (const auto& item : value->items) tensors.push_back(item.get());
      } else if (form != Form::kPerBucket) {
        tensors.push_back(value);
      }
      if (tensors.empty()) {
        return DataLossError(where + ": no '" + std::string(kOptimKeys[r]) + "' " +
                             (form == Form::kPerBucket ? "list of bucket tensors" : "tensor"));
      }
      for (size_t k = 0; k < tensors.size(); ++k) {
        const std::string what = "buffer " + std::to_string(g) + " '" +
                                 std::string(kOptimKeys[r]) + "'" +
                                 (form == Form::kPerBucket ? " bucket " + std::to_string(k) : "");
        if (tensors[k] == nullptr || !LooksLikeTensor(*tensors[k])) {
          return DataLossError(where + ": no tensor for " + what);
        }
        FC_ASSIGN_OR_RETURN(Located l, f.Locate(*tensors[k], what));
        if (l.dtype != DType::kFloat32 || l.shape.size() != 1 || !l.contiguous ||
            (numel && l.shape[0] != *numel)) {
          return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                               ShapeText(l.shape) + ", expected contiguous float32 [" +
                               (numel ? std::to_string(*numel) + "] (numel_unpadded)" : "n]"));
        }
        flat[r].push_back(std::move(l));
      }
      if (flat[r].size() != flat[0].size()) {
        return DataLossError(where + ": " + std::to_string(flat[0].size()) + " '" +
                             std::string(kOptimKeys[0]) + "' bucket tensors but " +
                             std::to_string(flat[r].size()) + " '" + std::string(kOptimKeys[r]) +
                             "'");
      }
      for (size_t k = 0; k < flat[r].size(); ++k) {
        if (flat[r][k].shape != flat[0][k].shape) {
          return DataLossError(flat[r][k].where + " is " + ShapeText(flat[r][k].shape) + ", " +
                               flat[0][k].where + " " + ShapeText(flat[0][k].shape));
        }
      }
    }
    // The per-bucket form's own record of the padded bucket sizes, when it has the shape
    // Megatron gave it (a list over buffers of {dtype: [numel per bucket]}); a cross-check.
    std::optional<std::vector<int64_t>> recorded_buckets;
    if (form == Form::kPerBucket && per_bucket_numel->is_list() &&
        per_bucket_numel->items.size() == buffers.size() && per_bucket_numel->items[g]) {
      const Entries* e = DictEntries(per_bucket_numel->items[g].get());
      if (e != nullptr && e->size() == 1 && (*e)[0].second && (*e)[0].second->is_list()) {
        std::vector<int64_t> sizes;
        for (const auto& item : (*e)[0].second->items) {
          const std::optional<int64_t> n = IntOf(item.get());
          if (!n) break;
          sizes.push_back(*n);
        }
        if (sizes.size() == (*e)[0].second->items.size()) recorded_buckets = std::move(sizes);
      }
    }
    std::vector<BufferParam> params;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const std::string& n = b.params[i]->name;
      FC_ASSIGN_OR_RETURN(const int64_t count, CheckedNumElements(b.located[i].shape));
      params.push_back(BufferParam{count, shared_embeddings && IsEmbeddingOrOutput(n)});
    }
    std::vector<BufferLayoutRule> rules;
    if (form == Form::kWhole) {
      // One buffer, params back to back, nothing special for a shared embedding.
      rules.push_back(BufferLayoutRule{1, std::nullopt, 0, 0, false});
    } else {
      FC_ASSIGN_OR_RETURN(rules, LayoutCandidates(p, b.v, rank_numel));
      if (form == Form::kPerBucket) {
        // Those versions had no shared-embedding start padding; a shared embedding's bucket
        // of its own came at some point in them: both are tried.
        std::vector<BufferLayoutRule> older;
        for (const BufferLayoutRule& r : rules) {
          if (r.shared_start_dp > 0) continue;
          older.push_back(r);
          if (shared_embeddings) {
            older.push_back(r);
            older.back().shared_own_bucket = false;
          }
        }
        rules = std::move(older);
      }
    }
    std::string tried;
    // A layout that fits: over the params `kept` (indices into b.params, in order), the
    // others frozen (not in the buffer: Megatron leaves out params without requires_grad).
    struct Fit {
      CoalescedLayout layout;
      std::vector<size_t> kept;
    };
    std::optional<Fit> found;
    std::string found_rule;
    // Param j of a layout in the saved tensors: which one, and where.
    auto place = [form](const CoalescedLayout& l, size_t j) {
      return form == Form::kPerBucket
                 ? std::pair<size_t, int64_t>(static_cast<size_t>(l.bucket_of[j]),
                                              BucketOffset(l, j))
                 : std::pair<size_t, int64_t>(0, l.offsets[j]);
    };
    auto same_places = [&](const Fit& a, const Fit& c) {
      return a.kept == c.kept && a.layout.offsets == c.layout.offsets &&
             (form != Form::kPerBucket || a.layout.bucket_of == c.layout.bucket_of);
    };
    // Whether param i's master weight at `where` rounds to its model weight (inside the saved
    // tensor).
    auto check = [&](size_t i, std::pair<size_t, int64_t> where) -> Status {
      if (where.first >= flat[0].size() || where.second < 0 ||
          where.second > flat[0][where.first].shape[0] - params[i].numel) {
        return DataLossError("'" + b.params[i]->name + "' would lie past the end of the " +
                             "saved " + std::string(kOptimKeys[0]) + " tensor " +
                             std::to_string(where.first));
      }
      Located master = flat[0][where.first];
      master.first += static_cast<uint64_t>(where.second) * 4;
      return CheckMasterRoundsToModel(*f.file, master, *model.file, b.located[i],
                                      b.params[i]->name);
    };
    // Every candidate is tried: two that fit with different offsets (constant params next to
    // zero-filled gaps could do that) leave the file unread rather than guessed.
    for (const BufferLayoutRule& rule : rules) {
      // The params are checked in buffer order (the reverse of theirs). Where one's place
      // holds other values, it is taken for frozen when a later param (in buffer order)
      // holds them: that one and the params between are left out, the layout computed
      // again without them, and the walk goes on from there; when no later param holds
      // them, it and all after it are left out (the buffer ends there), for the sizes to
      // confirm. Params before a frozen one keep their places, so it stops after at most as
      // many layouts as frozen runs.
      Fit fit;
      std::vector<bool> frozen(params.size(), false);
      Status ok = Status::Ok();
      std::string first_mismatch;  // what failed before any param was taken for frozen
      size_t resume = params.size();  // in buffer order: params at kept positions >= are checked
      while (true) {
        fit.kept.clear();
        std::vector<BufferParam> kept_params;
        for (size_t i = 0; i < params.size(); ++i) {
          if (frozen[i]) continue;
          fit.kept.push_back(i);
          kept_params.push_back(params[i]);
        }
        auto computed = CoalescedBufferLayout(kept_params, rule);
        if (!computed.ok()) return computed.status().With(where);
        fit.layout = std::move(*computed);
        ok = Status::Ok();
        size_t failed = fit.kept.size();
        for (size_t j = std::min(resume, fit.kept.size()); j-- > 0;) {
          ok = check(fit.kept[j], place(fit.layout, j));
          if (!ok.ok()) {
            failed = j;
            if (first_mismatch.empty()) first_mismatch = ok.message();
            break;
          }
        }
        if (ok.ok()) break;
        // The first later param (buffer order) that holds the values at the failed place.
        std::optional<size_t> holder;
        for (size_t m = failed; m-- > 0;) {
          if (check(fit.kept[m], place(fit.layout, failed)).ok()) {
            holder = m;
            break;
          }
        }
        // None: it and every param after it are frozen (the buffer ends there), which the
        // sizes checked below confirm or not.
        const size_t first_kept = holder ? *holder + 1 : 0;
        for (size_t m = first_kept; m <= failed; ++m) frozen[fit.kept[m]] = true;
        resume = first_kept;
        if (std::count(frozen.begin(), frozen.end(), false) == 0) break;  // nothing is left
      }
      if (ok.ok() && form == Form::kCoalesced && fit.layout.numel_unpadded != *numel) {
        ok = DataLossError("makes " + std::to_string(fit.layout.numel_unpadded) +
                           " elements, the file has " + std::to_string(*numel));
      } else if (ok.ok() && form == Form::kPerBucket &&
                 static_cast<size_t>(fit.layout.buckets) != flat[0].size()) {
        ok = DataLossError("makes " + std::to_string(fit.layout.buckets) +
                           " buckets, the file has " + std::to_string(flat[0].size()));
      } else if (ok.ok() && form != Form::kCoalesced) {
        // Each saved tensor: its bucket (the whole buffer: one bucket), padded by less than
        // the data-parallel size, and the size the file records.
        for (size_t k = 0; ok.ok() && k < flat[0].size(); ++k) {
          const int64_t have = flat[0][k].shape[0];
          const int64_t want = fit.layout.bucket_numel_unpadded[k];
          if (have < want || have - want >= max_padding) {
            ok = DataLossError("makes bucket " + std::to_string(k) + " " + std::to_string(want) +
                               " elements, the file's tensor has " + std::to_string(have));
          } else if (recorded_buckets && (recorded_buckets->size() != flat[0].size() ||
                                          (*recorded_buckets)[k] != have)) {
            ok = DataLossError("per_bucket_numel does not match the bucket tensors' sizes");
          }
        }
      }
      if (!ok.ok()) {
        tried += "; " + RuleText(rule) + ": " + (first_mismatch.empty() ? ok.message()
                                                                        : first_mismatch);
        continue;
      }
      if (found && !same_places(*found, fit)) {
        return DataLossError(where + ": two Megatron buffer layouts fit (" + found_rule + "; " +
                             RuleText(rule) + ") with different offsets; not guessing");
      }
      if (!found) {
        found = std::move(fit);
        found_rule = form_text + RuleText(rule);
      }
    }
    if (found) optim_layouts_.insert(found_rule);
    if (!found) {
      return DataLossError(where + ": no Megatron buffer layout fits (params of " + model.rel +
                           " in reverse order" + tried + ")");
    }
    for (size_t j = 0, i = 0; i < b.params.size(); ++i) {
      if (j == found->kept.size() || found->kept[j] != i) {
        frozen_.insert(b.params[i]->name);  // not in the buffer: no optimizer state
        continue;
      }
      std::array<Located, 3> states3;
      for (size_t r = 0; r < 3; ++r) {
        const auto [tensor, offset] = place(found->layout, j);
        Located& l = states3[r];
        l = flat[r][tensor];
        l.shape = b.located[i].shape;
        l.strides.assign(l.shape.size(), 1);
        for (size_t d = l.shape.size(); d-- > 1;) l.strides[d - 1] = l.strides[d] * l.shape[d];
        l.first += static_cast<uint64_t>(offset) * 4;
        l.where = f.rel + ": " + std::string(kOptimRoles[r]) + " of '" + b.params[i]->name + "'";
      }
      optim_[{p, e, t, b.v, b.params[i]->name}] = std::move(states3);
      ++j;
    }
  }
  return Status::Ok();
}

Result<std::string> Reader::ResolveDir(const std::string& path) {
  if (!IsDirectory(path)) return NotFoundError(path + ": not a directory");
  if (HasRankDirs(path)) return path;
  FC_ASSIGN_OR_RETURN(std::optional<std::string> sub, LatestIterationDir(path));
  if (!sub) {
    return NotFoundError(path + ": neither a Megatron iteration dir (mp_rank_*/" +
                         std::string(kRankFile) + ") nor a save dir (" +
                         std::string(kLatestFile) + ")");
  }
  const std::string dir = path + "/" + *sub;
  if (!IsDirectory(dir)) {
    return NotFoundError(path + "/" + std::string(kLatestFile) + " names '" + *sub + "', but " +
                         dir + " is not a directory");
  }
  return dir;
}

Status Reader::CheckDegree(const char* key, int64_t found, const std::string& what) const {
  const auto v = ArgInt(key);
  if (!v) return Status::Ok();
  const int64_t want = std::max<int64_t>(*v, 1);
  if (want != found) {
    return DataLossError(args_file_ + ": args." + key + " is " + std::to_string(*v) + ", but " +
                         dir_ + " holds " + std::to_string(found) + " " + what);
  }
  return Status::Ok();
}

// Chunk of rows [lo, hi) (of dim 0) of a located piece, placed at `offset` in the global
// tensor.
Chunk PieceChunk(const Located& l, int64_t lo, int64_t hi, Shape offset) {
  const size_t item = DTypeSize(l.dtype);
  Chunk c;
  c.file = l.file;
  c.box.global_offset = std::move(offset);
  c.box.local_shape = l.shape;
  if (!l.shape.empty()) c.box.local_shape[0] = hi - lo;
  const int64_t row_stride = l.shape.empty() ? 0 : l.strides[0];
  c.byte_offset = l.first + static_cast<uint64_t>(lo * row_stride) * item;
  if (l.contiguous) {
    c.byte_length = static_cast<uint64_t>(c.box.num_elements()) * item;
    return c;
  }
  c.strides = l.strides;
  // The view's span: (sum_j (n_j - 1) * stride_j + 1) elements; none for an empty box.
  if (c.box.num_elements() == 0) {
    c.byte_length = 0;
    return c;
  }
  int64_t span = 1;
  for (size_t d = 0; d < c.box.local_shape.size(); ++d) {
    span += (c.box.local_shape[d] - 1) * c.strides[d];
  }
  c.byte_length = static_cast<uint64_t>(span) * item;
  return c;
}

Status Reader::MergeTp(const std::vector<std::string>& order,
                       const std::vector<std::map<std::string, Located>>& per_tp,
                       std::optional<bool> swiglu) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  for (int64_t t = 1; t < tp; ++t) {
    for (const auto& [name, l] : per_tp[static_cast<size_t>(t)]) {
      if (!per_tp[0].count(name)) {
        return DataLossError(l.where + " is absent from TP rank 0");
      }
    }
  }
  for (const std::string& name : order) {
    std::vector<const Located*> parts;
    for (int64_t t = 0; t < tp; ++t) {
      auto it = per_tp[static_cast<size_t>(t)].find(name);
      if (it == per_tp[static_cast<size_t>(t)].end()) {
        return DataLossError(per_tp[0].at(name).where + " is absent from TP rank " +
                             std::to_string(t));
      }
      const Located& l = it->second;
      if (!parts.empty() && (l.dtype != parts[0]->dtype || l.shape.size() != parts[0]->shape.size())) {
        return DataLossError(l.where + " is " + std::string(DTypeName(l.dtype)) + " " +
                             ShapeText(l.shape) + ", TP rank 0's is " +
                             std::string(DTypeName(parts[0]->dtype)) + " " +
                             ShapeText(parts[0]->shape));
      }
      parts.push_back(&l);
    }
    const Located& l0 = *parts[0];
    TensorEntry e;
    e.key = name;
    e.dtype = l0.dtype;
    e.global_shape = l0.shape;
    const Shape zero(l0.shape.size(), 0);
    RoleInfo role{Role::kReplicated, false};
    if (tp > 1) {
      FC_ASSIGN_OR_RETURN(role, TpRole(name, l0));
    }
    auto differs = [&](size_t except) -> const Located* {
      for (const Located* p : parts) {
        for (size_t d = 0; d < l0.shape.size(); ++d) {
          if (d != except && p->shape[d] != l0.shape[d]) return p;
        }
      }
      return nullptr;
    };
    auto shape_error = [&](const Located* p, const std::string& rule) {
      return DataLossError(p->where + " is " + ShapeText(p->shape) + ", TP rank 0's " +
                           ShapeText(l0.shape) + " (" + rule + ")");
    };
    if (role.role == Role::kUnknown) {
      // Not in the table: nothing says how the ranks' copies combine; keep them apart.
      unmerged_.insert(std::string(ParamNameOf(name)));
      for (int64_t t = 0; t < tp; ++t) {
        const Located& l = *parts[static_cast<size_t>(t)];
        TensorEntry r;
        std::string tt = std::to_string(t);
        if (tt.size() < 2) tt.insert(0, 2 - tt.size(), '0');
        r.key = "mp_rank_" + tt + "." + name;
        r.dtype = l.dtype;
        r.global_shape = l.shape;
        r.chunks.push_back(PieceChunk(l, 0, l.shape.empty() ? 0 : l.shape[0], zero));
        index_.tensors.push_back(std::move(r));
      }
      continue;
    }
    if (role.role == Role::kReplicated) {
      if (const Located* p = differs(SIZE_MAX)) return shape_error(p, "replicated across TP");
      e.chunks.push_back(PieceChunk(l0, 0, l0.shape.empty() ? 0 : l0.shape[0], zero));
    } else if (role.role == Role::kColumn && role.gated && !swiglu) {
      return UnimplementedError(l0.where + ": args has no 'swiglu', so fc cannot tell whether "
                                "each TP rank holds [gate_r; up_r] halves (SwiGLU) or one "
                                "slice; refusing to merge '" + name + "'");
    } else if (role.role == Role::kColumn && role.gated && *swiglu) {
      // SwiGLU: rank r holds [gate_r; up_r]; global = [gate_0 .. gate_{tp-1}; up_0 .. up_{tp-1}].
      if (const Located* p = differs(0)) return shape_error(p, "SwiGLU halves along dim 0");
      const int64_t rows = l0.shape[0];
      if (rows % 2 != 0) {
        return DataLossError(l0.where + " has " + std::to_string(rows) +
                             " rows; with swiglu each TP rank holds two equal halves");
      }
      const int64_t half = rows / 2;
      for (int64_t t = 0; t < tp; ++t) {
        Shape gate = zero, up = zero;
        gate[0] = t * half;
        up[0] = tp * half + t * half;
        e.chunks.push_back(PieceChunk(*parts[static_cast<size_t>(t)], 0, half, gate));
        e.chunks.push_back(PieceChunk(*parts[static_cast<size_t>(t)], half, rows, up));
      }
      e.global_shape[0] = rows * tp;
    } else {
      const size_t d = role.axis;
      if (const Located* p = differs(d)) {
        return shape_error(p, "concatenated along dim " + std::to_string(d));
      }
      int64_t off = 0;
      for (const Located* p : parts) {
        Shape o = zero;
        o[d] = off;
        e.chunks.push_back(PieceChunk(*p, 0, p->shape[0], o));
        const auto next = CheckedAdd(off, p->shape[d]);
        if (!next) return OutOfRangeError(p->where + ": merged extent overflows");
        off = *next;
      }
      e.global_shape[d] = off;
    }
    index_.tensors.push_back(std::move(e));
  }
  return Status::Ok();
}

Result<RoleInfo> Reader::TpRole(const std::string& name, const Located& l0) const {
  if (!options_.tp_axis) {
    RoleInfo role = RoleOf(name);
    if (role.role != Role::kReplicated && role.role != Role::kUnknown &&
        role.axis >= l0.shape.size()) {
      role = {};  // a scalar or 1-d tensor under a split name: not what the table means
    }
    return role;
  }
  const std::optional<int64_t> axis = options_.tp_axis(ParamNameOf(name));
  if (!axis) return RoleInfo{Role::kReplicated, false};
  if (*axis < 0 || static_cast<size_t>(*axis) >= l0.shape.size()) {
    return InvalidArgumentError(options_.tp_axis_origin + ": tensor_parallel axis " +
                                std::to_string(*axis) + " is out of range for '" + name + "' " +
                                ShapeText(l0.shape) + " (" + l0.where + ")");
  }
  RoleInfo role{*axis == 0 ? Role::kColumn : Role::kRow, false, static_cast<size_t>(*axis)};
  // SwiGLU halves stay a property of the fc1 names whatever says how they are split.
  role.gated = *axis == 0 && RoleOf(name).gated;
  return role;
}

Result<CheckpointIndex> Reader::Read(const std::string& path) {
  FC_ASSIGN_OR_RETURN(dir_, ResolveDir(path));
  index_.format = CheckpointFormat::kMegatronLegacy;
  index_.root = dir_;
  {
    std::string p = dir_;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.find_last_of('/');
    index_.attributes["megatron.checkpoint_dir"] = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  // Rank dirs: all with the same number of indices.
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir_));
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, std::vector<int64_t>>> dirs;
  for (const std::string& n : names) {
    std::vector<int64_t> nums = RankNumbers(n);
    if (nums.empty() || !IsDirectory(dir_ + "/" + n)) continue;
    if (!dirs.empty() && dirs[0].second.size() != nums.size()) {
      return DataLossError(dir_ + ": rank dirs " + dirs[0].first + " and " + n +
                           " name different numbers of parallel ranks");
    }
    dirs.emplace_back(n, std::move(nums));
  }
  if (dirs.empty()) return NotFoundError(dir_ + ": no mp_rank_* directories");
  // The first rank's args decide what a second index means (_PPP or _EEE).
  const std::string first_rel = dirs[0].first + "/" + std::string(kRankFile);
  if (!PathExists(dir_ + "/" + first_rel)) return NotFoundError(dir_ + "/" + first_rel + ": missing");
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> first, OpenRankFile(dir_, first_rel, 0));
  files_.push_back(std::move(first));
  args_ = ArgsDict(*files_[0]);
  args_file_ = first_rel;
  const size_t k = dirs[0].second.size();
  bool second_is_ep = false;
  if (k == 2) {
    const int64_t pp_arg = ArgInt("pipeline_model_parallel_size").value_or(0);
    const int64_t ep_arg = ArgInt("expert_model_parallel_size").value_or(0);
    second_is_ep = pp_arg <= 1 && ep_arg > 1;
  }
  Degrees deg;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> by_rank;
  for (const auto& [n, nums] : dirs) {
    const int64_t t = nums[0];
    const int64_t p = k == 3 || (k == 2 && !second_is_ep) ? nums[1] : 0;
    const int64_t e = k == 3 ? nums[2] : (k == 2 && second_is_ep ? nums[1] : 0);
    if (t >= 100000 || p >= 100000 || e >= 100000) {
      return DataLossError(dir_ + "/" + n + ": rank number out of range");
    }
    deg.tp = std::max(deg.tp, t + 1);
    deg.pp = std::max(deg.pp, p + 1);
    deg.ep = std::max(deg.ep, e + 1);
    by_rank[{t, p, e}] = n;
  }
  // A full grid; the name of a missing rank follows Megatron's get_checkpoint_name.
  auto rank_dir_name = [&](int64_t t, int64_t p, int64_t e) {
    auto pad = [](int64_t v, size_t w) {
      std::string s = std::to_string(v);
      if (s.size() < w) s.insert(0, w - s.size(), '0');
      return s;
    };
    std::string n = "mp_rank_" + pad(t, 2);
    if (k == 3 || (k == 2 && !second_is_ep)) n += "_" + pad(p, 3);
    if (k == 3 || (k == 2 && second_is_ep)) n += "_" + pad(e, 3);
    return n;
  };
  for (int64_t p = 0; p < deg.pp; ++p) {
    for (int64_t e = 0; e < deg.ep; ++e) {
      for (int64_t t = 0; t < deg.tp; ++t) {
        auto it = by_rank.find({t, p, e});
        const std::string n = it == by_rank.end() ? rank_dir_name(t, p, e) : it->second;
        const std::string rel = n + "/" + std::string(kRankFile);
        if (!PathExists(dir_ + "/" + rel)) {
          return NotFoundError(dir_ + "/" + rel + ": missing (the rank dirs present make a TP " +
                               std::to_string(deg.tp) + " x PP " + std::to_string(deg.pp) +
                               " x EP " + std::to_string(deg.ep) + " grid)");
        }
      }
    }
  }
  FC_RETURN_IF_ERROR(CheckDegree("tensor_model_parallel_size", deg.tp, "TP ranks (mp_rank_TT)"));
  FC_RETURN_IF_ERROR(CheckDegree("pipeline_model_parallel_size", deg.pp, "pipeline stages"));
  FC_RETURN_IF_ERROR(CheckDegree("expert_model_parallel_size", deg.ep, "expert-parallel ranks"));
  if (auto etp = ArgInt("expert_tensor_parallel_size"); etp && *etp != deg.tp && deg.ep > 1) {
    return UnimplementedError(args_file_ + ": expert_tensor_parallel_size " + std::to_string(*etp) +
                              " differs from the TP degree " + std::to_string(deg.tp) +
                              "; fc does not read that layout yet");
  }

  // Open every rank file (grid order: stage, expert rank, TP rank).
  std::map<std::tuple<int64_t, int64_t, int64_t>, const RankFile*> grid;
  int64_t distrib_optim = 0;
  for (int64_t p = 0; p < deg.pp; ++p) {
    for (int64_t e = 0; e < deg.ep; ++e) {
      for (int64_t t = 0; t < deg.tp; ++t) {
        const std::string n = by_rank.at({t, p, e});
        const std::string rel = n + "/" + std::string(kRankFile);
        RankFile* f = nullptr;
        if (rel == first_rel) {
          f = files_[0].get();
        } else {
          FC_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> opened,
                              OpenRankFile(dir_, rel, static_cast<uint32_t>(files_.size())));
          files_.push_back(std::move(opened));
          f = files_.back().get();
        }
        f->tp = t;
        f->pp = p;
        f->ep = e;
        grid[{p, e, t}] = f;
        if (PathExists(dir_ + "/" + n + "/" + std::string(kDistribOptimFile))) ++distrib_optim;
      }
    }
  }
  // Files are listed in the order they were opened (file index == position).
  std::sort(files_.begin(), files_.end(),
            [](const auto& a, const auto& b) { return a->index < b->index; });
  for (const auto& f : files_) index_.files.push_back(FileInfo{f->rel, f->file->size()});

  // iteration and checkpoint_version: the same in every file.
  std::optional<int64_t> iteration;
  std::string version;
  for (const auto& f : files_) {
    const auto it = IntOf(f->root.Find("iteration"));
    if (it && iteration && *it != *iteration) {
      return DataLossError(f->rel + ": iteration " + std::to_string(*it) + ", " + args_file_ +
                           ": " + std::to_string(*iteration));
    }
    if (it) iteration = it;
    std::string v;
    if (const PV* cv = f->root.Find("checkpoint_version")) {
      if (cv->kind == PV::Kind::kFloat) v = FloatText(cv->float_value);
      else if (cv->is_int()) v = FloatText(static_cast<double>(cv->int_value));
      if (!v.empty() && ((cv->kind == PV::Kind::kFloat && cv->float_value < 2.0) ||
                         (cv->is_int() && cv->int_value < 2))) {
        return UnimplementedError(f->rel + ": checkpoint_version " + v + " (< 2.0: the old QKV "
                                  "ordering that Megatron's fix_query_key_value_ordering "
                                  "rewrites on load); fc does not read it");
      }
    }
    if (!version.empty() && v != version) {
      return DataLossError(f->rel + ": checkpoint_version " + v + ", " + args_file_ + ": " +
                           version);
    }
    version = v;
  }
  if (iteration) index_.attributes["megatron.iteration"] = std::to_string(*iteration);
  index_.attributes["megatron.checkpoint_version"] = version.empty() ? "absent" : version;
  if (iteration && index_.attributes["megatron.checkpoint_dir"].starts_with("iter_")) {
    int64_t named = -1;
    ParseUint(std::string_view(index_.attributes["megatron.checkpoint_dir"]).substr(5), &named);
    if (named != *iteration) {
      return DataLossError(args_file_ + ": iteration " + std::to_string(*iteration) +
                           ", but the directory is " + index_.attributes["megatron.checkpoint_dir"]);
    }
  }

  // Model chunks: model, or model0..model{V-1} (virtual pipeline).
  int64_t vpp = 0;
  const bool virtual_pp = files_[0]->root.Find("model") == nullptr;
  if (virtual_pp) {
    while (files_[0]->root.Find("model" + std::to_string(vpp)) != nullptr) ++vpp;
    if (vpp == 0) return DataLossError(args_file_ + ": no 'model' (or 'model0') state dict");
    FC_RETURN_IF_ERROR(CheckDegree("virtual_pipeline_model_parallel_size", vpp,
                                   "virtual pipeline chunks (model0, model1, ...)"));
  } else {
    vpp = 1;
    if (auto v = ArgInt("virtual_pipeline_model_parallel_size"); v && *v > 1) {
      return DataLossError(args_file_ + ": args.virtual_pipeline_model_parallel_size is " +
                           std::to_string(*v) + ", but the file holds one 'model' state dict");
    }
  }
  auto model_key = [&](int64_t v) { return virtual_pp ? "model" + std::to_string(v) : std::string("model"); };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<Piece>> pieces;  // p, e, t, v
  int64_t skipped = 0;
  for (const auto& [pet, f] : grid) {
    for (int64_t v = 0; v < vpp; ++v) {
      const PV* m = f->root.Find(model_key(v));
      if (m == nullptr || DictEntries(m) == nullptr) {
        return DataLossError(f->rel + ": '" + model_key(v) + "' is " +
                             (m ? m->DebugString() : std::string("missing")) +
                             ", expected the model's state dict");
      }
      auto& list = pieces[{std::get<0>(pet), std::get<1>(pet), std::get<2>(pet), v}];
      FC_RETURN_IF_ERROR(FlattenStateDict(*f, *m, "", 0, &list, &skipped));
    }
  }

  // Layer offsets: chunk v of stage p follows chunks (v' < v, any stage) and (v, p' < p).
  std::map<std::pair<int64_t, int64_t>, int64_t> offset;  // (v, p) -> first global layer
  int64_t layers = 0;
  for (int64_t v = 0; v < vpp; ++v) {
    for (int64_t p = 0; p < deg.pp; ++p) {
      std::set<int64_t> local;
      for (const Piece& pc : pieces.at({p, 0, 0, v})) {
        const auto parts = Split(pc.name, '.');
        if (auto li = LayerComponent(parts)) {
          int64_t n = 0;
          ParseUint(parts[*li], &n);
          local.insert(n);
        }
      }
      if (!local.empty() && (*local.begin() != 0 || *local.rbegin() + 1 != static_cast<int64_t>(local.size()))) {
        return DataLossError(grid.at({p, 0, 0})->rel + ": " + model_key(v) +
                             " layer numbers are not 0.." + std::to_string(local.size() - 1) +
                             " (found up to " + std::to_string(*local.rbegin()) + ")");
      }
      offset[{v, p}] = layers;
      layers += static_cast<int64_t>(local.size());
    }
  }
  if (auto nl = ArgInt("num_layers"); nl && layers > 0 && *nl != layers) {
    return DataLossError(args_file_ + ": args.num_layers is " + std::to_string(*nl) + ", but the " +
                         std::to_string(deg.pp * vpp) + " pipeline chunks hold " +
                         std::to_string(layers) + " layers");
  }
  const std::optional<int64_t> num_experts = ArgInt("num_experts");
  if (num_experts && *num_experts > 0 && *num_experts % deg.ep != 0) {
    return DataLossError(args_file_ + ": args.num_experts " + std::to_string(*num_experts) +
                         " is not divisible by the " + std::to_string(deg.ep) +
                         " expert-parallel ranks");
  }

  // The distributed optimizer's states, when every rank's distrib_optim.pt maps onto its
  // params; otherwise the reason they are not read.
  std::string optim_not_read;
  if (distrib_optim > 0) {
    const size_t opened = files_.size();
    Status st = ReadDistribOptim(grid, pieces, deg, vpp);
    if (st.ok() && !frozen_.empty()) {
      // A frozen param is frozen on every TP rank: each param with states has them on all.
      std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, int64_t> ranks;
      for (const auto& [key, states] : optim_) {
        const auto& [p, e, t, v, name] = key;
        ++ranks[{p, e, v, name}];
      }
      for (const auto& [key, n] : ranks) {
        if (n != deg.tp) {
          st = DataLossError("'" + std::get<3>(key) + "' has optimizer states on " +
                             std::to_string(n) + " of " + std::to_string(deg.tp) +
                             " TP ranks (taken for frozen on the others)");
          break;
        }
      }
    }
    if (!st.ok()) {
      optim_not_read = st.message();
      optim_.clear();
      optim_layouts_.clear();
      frozen_.clear();
      files_.resize(opened);
      index_.files.resize(opened);
    }
  }
  const PV* opt = files_[0]->root.Find("optimizer");
  const PV* opt0 = opt != nullptr && opt->is_list() && !opt->items.empty() ? opt->items[0].get() : opt;
  const bool float16 = distrib_optim == 0 && opt0 != nullptr &&
                       opt0->Find("fp32_from_fp16_params") != nullptr;
  const bool fp32_optimizer = distrib_optim == 0 && opt0 != nullptr && IsFp32OptimizerState(*opt0);
  if (float16 || fp32_optimizer) {
    Status st = ReadFloat16Optimizer(grid, pieces, vpp);
    if (!st.ok()) {
      optim_not_read = st.message();
      optim_.clear();
    }
  }

  // Global names, per TP rank; the first stage / EP rank 0 copy of a shared tensor wins.
  std::vector<std::map<std::string, Located>> per_tp(static_cast<size_t>(deg.tp));
  std::vector<std::string> order;
  std::vector<std::map<std::string, Located>> optim_per_tp(static_cast<size_t>(deg.tp));
  std::vector<std::string> optim_order;
  for (int64_t v = 0; v < vpp; ++v) {
    for (int64_t p = 0; p < deg.pp; ++p) {
      for (int64_t e = 0; e < deg.ep; ++e) {
        for (int64_t t = 0; t < deg.tp; ++t) {
          const RankFile& f = *grid.at({p, e, t});
          const std::vector<Piece>& list = pieces.at({p, e, t, v});
          // Local experts per EP rank: num_experts / EP, else as many as this rank holds.
          int64_t local_experts = num_experts && *num_experts > 0 ? *num_experts / deg.ep : 0;
          if (local_experts == 0) {
            for (const Piece& pc : list) {
              if (auto x = ExpertOf(Split(pc.name, '.'))) {
                local_experts = std::max(local_experts, x->local + 1);
              }
            }
          }
          for (const Piece& pc : list) {
            std::vector<std::string_view> parts = Split(pc.name, '.');
            std::string layer_text, expert_text;
            if (auto li = LayerComponent(parts)) {
              int64_t n = 0;
              ParseUint(parts[*li], &n);
              layer_text = std::to_string(offset.at({v, p}) + n);
              parts[*li] = layer_text;
            }
            const auto x = ExpertOf(parts);
            if (x) {
              if (x->local >= local_experts) {
                return DataLossError(f.rel + ": '" + pc.name + "' is local expert " +
                                     std::to_string(x->local) + ", but each of the " +
                                     std::to_string(deg.ep) + " EP ranks holds " +
                                     std::to_string(local_experts) + " (args.num_experts)");
              }
              expert_text = std::string(parts[x->component].substr(0, x->stem)) +
                            std::to_string(e * local_experts + x->local);
              parts[x->component] = expert_text;
            } else if (e > 0) {
              continue;  // a copy of EP rank 0's tensor
            }
            const std::string name = Join(parts);
            auto& mine = per_tp[static_cast<size_t>(t)];
            FC_ASSIGN_OR_RETURN(Located l, f.Locate(*pc.value, "'" + pc.name + "'"));
            if (auto it = mine.find(name); it != mine.end()) {
              // Held by several stages (tied or shared): the first stage's copy is read.
              if (it->second.dtype != l.dtype || it->second.shape != l.shape) {
                return DataLossError(l.where + " (global name '" + name + "') is " +
                                     std::string(DTypeName(l.dtype)) + " " + ShapeText(l.shape) +
                                     ", " + it->second.where + " is " +
                                     std::string(DTypeName(it->second.dtype)) + " " +
                                     ShapeText(it->second.shape));
              }
              continue;
            }
            if (t == 0) order.push_back(name);
            mine.emplace(name, std::move(l));
            if (auto it = optim_.find({p, e, t, v, pc.name}); it != optim_.end()) {
              for (size_t r = 0; r < kOptimRoles.size(); ++r) {
                std::string key = "optimizer." + std::string(kOptimRoles[r]) + "." + name;
                if (t == 0) optim_order.push_back(key);
                optim_per_tp[static_cast<size_t>(t)].emplace(std::move(key), it->second[r]);
              }
            }
          }
        }
      }
    }
  }

  const PV* swiglu_v = args_ ? args_->Find("swiglu") : nullptr;
  const std::optional<bool> swiglu = BoolOf(swiglu_v);
  FC_RETURN_IF_ERROR(MergeTp(order, per_tp, swiglu));
  FC_RETURN_IF_ERROR(MergeTp(optim_order, optim_per_tp, swiglu));

  // Every element of every tensor is covered exactly once by construction; count to be sure.
  for (const TensorEntry& t : index_.tensors) {
    int64_t covered = 0;
    for (const Chunk& c : t.chunks) covered += c.stored_elements();
    FC_ASSIGN_OR_RETURN(const int64_t want, CheckedNumElements(t.global_shape));
    if (covered != want) {
      return DataLossError(dir_ + ": tensor '" + t.key + "' has " + std::to_string(covered) +
                           " elements in its chunks, shape " + ShapeText(t.global_shape) +
                           " needs " + std::to_string(want));
    }
  }

  auto& a = index_.attributes;
  a["megatron.tp_degree"] = std::to_string(deg.tp);
  a["megatron.pp_degree"] = std::to_string(deg.pp);
  a["megatron.ep_degree"] = std::to_string(deg.ep);
  a["megatron.vpp_degree"] = std::to_string(vpp);
  a["megatron.num_layers"] = std::to_string(layers);
  a["megatron.swiglu"] = swiglu ? (*swiglu ? "true" : "false") : "unknown";
  // The model facts of args that name mappings need (fc-export --hf-family): ints, bools
  // and strings as text, under megatron.args.<name>; absent when args lacks them.
  if (args_ != nullptr) {
    for (const char* k : {"num_attention_heads", "num_query_groups", "group_query_attention",
                          "kv_channels", "hidden_size", "ffn_hidden_size", "padded_vocab_size",
                          "add_qkv_bias", "add_bias_linear", "untie_embeddings_and_output_weights",
                          "num_experts", "normalization", "position_embedding_type"}) {
      const PV* v = args_->Find(k);
      if (v == nullptr) continue;
      if (auto i = IntOf(v)) {
        a[std::string("megatron.args.") + k] = std::to_string(*i);
      } else if (auto b = BoolOf(v)) {
        a[std::string("megatron.args.") + k] = *b ? "true" : "false";
      } else if (v->is_str()) {
        a[std::string("megatron.args.") + k] = v->str;
      }
    }
  }
  if (deg.tp > 1) {
    a["megatron.tp_merge"] = options_.tp_axis ? "tensor_parallel rules of " + options_.tp_axis_origin
                                              : "built-in Megatron-Core GPT table";
  }
  if (!unmerged_.empty()) {
    std::string s;
    for (const std::string& u : unmerged_) s += (s.empty() ? "" : ", ") + u;
    a["megatron.tp_unmerged"] = s;
  }
  if (skipped > 0) {
    a["megatron.skipped"] = std::to_string(skipped) + " non-tensor / _extra_state entries";
  }
  if (opt == nullptr || opt->is_none()) {
    a["megatron.optimizer"] = "absent";
  } else if (!optim_.empty()) {
    a["megatron.optimizer"] = std::string(float16          ? "Float16 optimizer"
                                          : fp32_optimizer ? "FP32Optimizer"
                                                           : "distributed optimizer") +
                              ": fp32 master weights and Adam moments read "
                              "(optimizer.{fp32,exp_avg,exp_avg_sq}.<param>)";
  } else if (opt->Find("param_state_sharding_type") != nullptr || distrib_optim > 0) {
    a["megatron.optimizer"] = "distributed optimizer, not read";
  } else if (float16) {
    a["megatron.optimizer"] = "Float16 optimizer (fp32_from_fp16_params), not read: " +
                              optim_not_read;
  } else if (fp32_optimizer) {
    a["megatron.optimizer"] = "FP32Optimizer ({state, param_groups}), not read: " +
                              optim_not_read;
  } else {
    a["megatron.optimizer"] = "present, not read";
  }
  if (distrib_optim > 0 && !optim_.empty()) {
    std::string rules;
    for (const std::string& r : optim_layouts_) rules += (rules.empty() ? "" : " | ") + r;
    a["megatron.distrib_optim"] = std::to_string(distrib_optim) + " files, read (" + rules + ")";
    if (!frozen_.empty()) {
      std::string names;
      for (const std::string& n : frozen_) names += (names.empty() ? "" : ", ") + n;
      a["megatron.distrib_optim"] += "; " + std::to_string(frozen_.size()) +
                                     " param(s) in no buffer (frozen: no optimizer state): " +
                                     names;
    }
  } else if (distrib_optim > 0) {
    a["megatron.distrib_optim"] = std::to_string(distrib_optim) + " files, not read: " +
                                  optim_not_read;
  }
  if (opt != nullptr) {
    // The Adam step: Megatron keeps it per param group (FusedAdam), and the distributed
    // optimizer drops the groups' param lists, so it is an attribute, not a tensor.
    const PV* groups = opt0 ? opt0->Find("optimizer") : nullptr;
    groups = groups ? groups->Find("param_groups")
                    : (fp32_optimizer ? opt0->Find("param_groups") : nullptr);
    std::set<int64_t> steps;
    if (groups != nullptr && groups->is_list()) {
      for (const auto& g : groups->items) {
        if (auto st = g ? IntOf(g->Find("step")) : std::nullopt) steps.insert(*st);
      }
    }
    // torch's Adam/AdamW (Megatron-Core's optimizer without Transformer Engine or Apex, as on
    // CPU) keeps the step per param in its state, a 0-d float32 tensor (an int before torch
    // 1.12): seen in Megatron-Core 0.16.1's FP32Optimizer.state_dict().
    if (steps.empty() && (float16 || fp32_optimizer)) {
      const PV* inner = fp32_optimizer ? opt0 : opt0->Find("optimizer");
      const PV* states = inner ? inner->Find("state") : nullptr;
      if (states != nullptr) {
        for (const auto& [k, v] : states->entries) {
          const PV* step = v ? v->Find("step") : nullptr;
          if (step == nullptr) continue;
          if (auto st = IntOf(step)) {
            steps.insert(*st);
          } else if (auto st2 = ScalarStep(*files_[0], *step)) {
            steps.insert(*st2);
          }
        }
      }
    }
    if (!steps.empty()) {
      std::string s;
      for (int64_t st : steps) s += (s.empty() ? "" : ", ") + std::to_string(st);
      a["megatron.optimizer_step"] = s;
    }
  }
  std::set<std::string> opaque;
  for (const auto& f : files_) CollectUnknownGlobals(f->root, AllowedGlobal, &opaque);
  if (!opaque.empty()) {
    std::string s;
    for (const std::string& g : opaque) s += (s.empty() ? "" : ", ") + g;
    a["megatron.opaque_globals"] = s;
  }
  return std::move(index_);
}

}  // namespace

bool IsMegatronLegacyCheckpointDir(const std::string& dir) {
  if (!IsDirectory(dir)) return false;
  if (HasRankDirs(dir)) return true;
  auto sub = LatestIterationDir(dir);
  return sub.ok() && sub->has_value() && HasRankDirs(dir + "/" + **sub);
}

Result<CheckpointIndex> ReadMegatronLegacyCheckpoint(const std::string& path,
                                                     MegatronReadOptions options) {
  Reader reader(std::move(options));
  return reader.Read(path);
}

Status SelectMegatronMasterWeights(CheckpointIndex* index) {
  if (index->format != CheckpointFormat::kMegatronLegacy) {
    return InvalidArgumentError("not a Megatron checkpoint");
  }
  constexpr std::string_view kFp32 = "optimizer.fp32.";
  const bool any = std::any_of(index->tensors.begin(), index->tensors.end(),
                               [&](const TensorEntry& t) { return t.key.starts_with(kFp32); });
  if (!any) {
    auto d = index->attributes.find("megatron.distrib_optim");
    auto o = index->attributes.find("megatron.optimizer");
    return UnimplementedError(
        index->root + ": no fp32 master weights to export (" +
        (d != index->attributes.end() ? "distrib_optim.pt: " + d->second
         : o != index->attributes.end() ? "optimizer: " + o->second
                                        : std::string("no optimizer state")) +
        "); export the model weights (--weights module)");
  }
  // Names outside the TP table stay per rank, "mp_rank_TT.optimizer.fp32.<name>": the
  // master weight of "mp_rank_TT.<name>".
  for (TensorEntry& t : index->tensors) {
    const size_t dot = t.key.find('.');
    if (t.key.starts_with("mp_rank_") && dot != std::string::npos &&
        std::string_view(t.key).substr(dot + 1).starts_with(kFp32)) {
      t.key = std::string(kFp32) + t.key.substr(0, dot + 1) + t.key.substr(dot + 1 + kFp32.size());
    }
  }
  FoldPrefixedTensors(index, kFp32, true);
  return Status::Ok();
}

}  // namespace fc
