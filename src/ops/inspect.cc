#include "fc/ops/inspect.h"
#include "fc/ops/hf_family.h"
#include "fc/ops/locate_chunks.h"

#include <algorithm>
#include <optional>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string_view>

#include "fc/codec/json_writer.h"
#include "fc/exec/parallel.h"
#include "fc/core/glob.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/open.h"
#include "fc/io/file.h"
#include "fc/layout/target_layout.h"
#include "fc/ops/report_format.h"
#include "fc/ops/targets.h"
#include "fc/ops/verify.h"

namespace fc {
namespace {

bool SameExtents(const std::vector<int64_t>& sizes) {
  for (int64_t s : sizes) {
    if (s != sizes.front()) return false;
  }
  return true;
}

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

void Ints(JsonWriter& j, const std::vector<int64_t>& values) {
  j.BeginArray(true);
  for (int64_t v : values) j.Int(v);
  j.EndArray();
}

// An encoded item (torch DCP stream transform): byte_offset/byte_length are then in the
// decoded item; this gives the stored range.
void EncodedItemJson(JsonWriter& j, const EncodedItem& e) {
  j.Key("encoded_item").BeginObject();
  j.Key("codec").String("zstd");
  j.Key("offset").Uint(e.encoded_offset);
  j.Key("length").Uint(e.encoded_length);
  j.EndObject();
}

void PrintSummary(const CheckpointIndex& index, const InspectOptions& options,
                  const std::vector<const TensorEntry*>& tensors, std::ostream& out) {
  uint64_t elements = 0, bytes = 0;
  std::map<std::string, int> dtypes;
  for (const TensorEntry* t : tensors) {
    int64_t n = 1;
    for (int64_t d : t->global_shape) n *= d;
    elements += static_cast<uint64_t>(n);
    bytes += static_cast<uint64_t>(n) * DTypeSize(t->dtype);
    ++dtypes[std::string(DTypeName(t->dtype))];
  }
  out << "format:   " << CheckpointFormatName(index.format);
  for (const auto& [k, v] : index.attributes) out << " (" << k << " " << v << ")";
  out << "\npath:     " << options.path << "\n";
  out << "files:    " << index.files.size() << " (" << HumanBytes(index.total_file_bytes()) << ")\n";
  out << "tensors:  " << tensors.size();
  if (tensors.size() != index.tensors.size()) out << " of " << index.tensors.size() << " (filtered)";
  out << ", " << elements << " elements, " << HumanBytes(bytes) << " of tensor data\n";
  out << "objects:  " << index.objects.size() << "\n";
  out << "dtypes:  ";
  for (const auto& [name, count] : dtypes) out << " " << name << " x" << count;
  out << "\n";
}

void PrintTensorTable(const std::vector<const TensorEntry*>& tensors, std::ostream& out) {
  TextTable table({"KEY", "DTYPE", "SHAPE", "CHUNKS", "SPLIT"});
  for (const TensorEntry* t : tensors) {
    table.AddRow({t->key, std::string(DTypeName(t->dtype)), ShapeText(t->global_shape),
                  std::to_string(t->chunks.size()), DescribeSplit(*t)});
  }
  out << "\n";
  table.Print(out);
}

void PrintObjects(const CheckpointIndex& index, std::ostream& out) {
  if (index.objects.empty()) return;
  out << "\nobjects (non-tensor values, carried as bytes):\n";
  for (const ObjectEntry& o : index.objects) {
    out << "  " << o.key << "  "
        << ObjectEncodingName(o.encoding) << ", "
        << o.byte_length << " bytes in " << index.files[o.file].path << "\n";
  }
}

// True when `text` is, whole, a number in JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?
// ([eE][+-]?[0-9]+)?. A scan, not a regex (attribute values come from the checkpoint).
bool IsJsonNumberText(std::string_view text) {
  size_t i = 0;
  const auto digits = [&]() {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == text.size();
}

// An attribute's value typed for JSON: a number where the whole text is one (kept as
// written: "3.0" stays 3.0), true/false for those words, otherwise a string.
void WriteAttributeValue(JsonWriter& j, const std::string& value) {
  if (value == "true" || value == "false") {
    j.Bool(value == "true");
  } else if (IsJsonNumberText(value)) {
    j.RawValue(value);
  } else {
    j.String(value);
  }
}

// Tensors are written in batches of about kJsonBatchChunks chunks: each batch's chunks are
// located together (fc/ops/locate_chunks.h: few reads, several threads) and the text goes to
// `out` as it grows, so memory holds one batch, not the whole document.
constexpr size_t kJsonBatchChunks = size_t{1} << 16;
constexpr size_t kJsonFlushBytes = size_t{1} << 20;

void WriteTensorJson(JsonWriter& j, const CheckpointIndex& index, const TensorEntry& t,
                     std::span<const Result<ChunkLocation>> places) {
  j.BeginObject();
  j.Key("key").String(t.key);
  j.Key("dtype").String(DTypeName(t.dtype));
  Ints(j.Key("global_shape"), t.global_shape);
  j.Key("split").String(DescribeSplit(t));
  j.Key("chunks").BeginArray();
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const Chunk& c = t.chunks[i];
    j.BeginObject();
    Ints(j.Key("global_offset"), c.box.global_offset);
    Ints(j.Key("local_shape"), c.box.local_shape);
    j.Key("flattened_range");
    if (c.flat_range) {
      Ints(j, {c.flat_range->inclusive_min, c.flat_range->exclusive_max});
    } else {
      j.Null();
    }
    j.Key("replica_id").Int(c.replica_id);
    j.Key("file").String(index.files[c.file].path);
    // Unlocated chunks (torch DCP) are located for the listing; one whose item is corrupt
    // keeps its item's range and says why.
    const Result<ChunkLocation>& place = places[i];
    const ChunkLocation fallback{c.byte_offset, c.byte_length, c.strides};
    const ChunkLocation& loc = place.ok() ? *place : fallback;
    j.Key("byte_offset").Uint(loc.byte_offset);
    j.Key("byte_length").Uint(loc.byte_length);
    if (!loc.strides.empty()) Ints(j.Key("strides"), loc.strides);
    if (c.encoded_item) EncodedItemJson(j, *c.encoded_item);
    if (!place.ok()) j.Key("locate_error").String(place.status().message());
    if (c.xxh3_64) j.Key("xxh3_64").String(HexU64(*c.xxh3_64));
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
}

void WriteJson(const CheckpointIndex& index, const std::vector<const TensorEntry*>& tensors,
               const VerifyReport* verify, std::ostream& out) {
  JsonWriter j(JsonWriter::Style::kCompact);
  ChunkReader reader(index);
  const int threads = WorkerThreads(0);
  j.BeginObject();
  j.Key("format").String(CheckpointFormatName(index.format));
  j.Key("root").String(index.root);
  j.Key("attributes").BeginObject();
  for (const auto& [k, v] : index.attributes) WriteAttributeValue(j.Key(k), v);
  j.EndObject();
  j.Key("files").BeginArray();
  for (const FileInfo& f : index.files) {
    j.BeginObject().Key("path").String(f.path).Key("size").Uint(f.size).EndObject();
  }
  j.EndArray();
  j.Key("tensors").BeginArray();
  std::vector<ChunkToLocate> batch;
  for (size_t first = 0; first < tensors.size();) {
    // Whole tensors, at least one, up to about kJsonBatchChunks chunks.
    size_t last = first;
    batch.clear();
    while (last < tensors.size() &&
           (last == first || batch.size() + tensors[last]->chunks.size() <= kJsonBatchChunks)) {
      for (const Chunk& c : tensors[last]->chunks) batch.push_back({&tensors[last]->key, &c});
      ++last;
    }
    const std::vector<Result<ChunkLocation>> places = LocateChunks(index, reader, batch, threads);
    size_t at = 0;
    for (size_t n = first; n < last; ++n) {
      const size_t count = tensors[n]->chunks.size();
      WriteTensorJson(j, index, *tensors[n],
                      std::span<const Result<ChunkLocation>>(places).subspan(at, count));
      at += count;
      if (j.str().size() >= kJsonFlushBytes) j.FlushTo(out);
    }
    first = last;
  }
  j.EndArray();
  j.Key("objects").BeginArray();
  for (const ObjectEntry& o : index.objects) {
    j.BeginObject();
    j.Key("key").String(o.key);
    j.Key("encoding").String(ObjectEncodingName(o.encoding));  // as in fc.metadata.json
    j.Key("file").String(index.files[o.file].path);
    j.Key("byte_offset").Uint(o.byte_offset);
    j.Key("byte_length").Uint(o.byte_length);
    if (o.encoded_item) EncodedItemJson(j, *o.encoded_item);
    j.EndObject();
  }
  j.EndArray();
  if (verify) {
    j.Key("verify").BeginObject();
    j.Key("ok").Bool(verify->problems.empty());
    j.Key("tensors_checked").Uint(verify->tensors_checked);
    j.Key("chunks_checked").Uint(verify->chunks_checked);
    j.Key("checksums_checked").Uint(verify->checksums_checked);
    j.Key("problem_count").Uint(verify->problem_count);  // "problems" lists the first 1000
    j.Key("problems").BeginArray();
    for (const VerifyProblem& p : verify->problems) {
      j.BeginObject().Key("file").String(p.file).Key("key").String(p.key);
      j.Key("what").String(p.what).EndObject();
    }
    j.EndArray();
    j.EndObject();
  }
  j.EndObject();
  j.FlushTo(out);
  out << "\n";
}

std::string ProblemLine(const VerifyProblem& p) {
  std::string s;
  if (!p.file.empty()) s += p.file + ": ";
  if (!p.key.empty()) s += "'" + p.key + "': ";
  return s + p.what;
}

}  // namespace

std::string DescribeSplit(const TensorEntry& tensor) {
  // Replicas: chunks with replica_id != 0 are copies of replica-0 data.
  std::vector<const Chunk*> primary;
  size_t flattened = 0;
  for (const Chunk& c : tensor.chunks) {
    if (c.replica_id == 0) primary.push_back(&c);
    if (c.flat_range) ++flattened;
  }
  if (tensor.chunks.empty()) return "no chunks";
  std::string replicas;
  if (primary.size() < tensor.chunks.size() && !primary.empty() &&
      tensor.chunks.size() % primary.size() == 0) {
    replicas = ", replicated x" + std::to_string(tensor.chunks.size() / primary.size());
  } else if (primary.size() < tensor.chunks.size()) {
    replicas = ", +" + std::to_string(tensor.chunks.size() - primary.size()) + " replica chunks";
  }
  // Sorted views, not sets of copies: a tensor may have thousands of chunks, and inspect
  // describes every tensor.
  if (flattened > 0) {
    std::vector<const Shape*> blocks;
    for (const Chunk* c : primary) blocks.push_back(&c->box.global_offset);
    std::sort(blocks.begin(), blocks.end(), [](const Shape* a, const Shape* b) { return *a < *b; });
    const size_t distinct = static_cast<size_t>(
        std::unique(blocks.begin(), blocks.end(),
                    [](const Shape* a, const Shape* b) { return *a == *b; }) -
        blocks.begin());
    std::string s = "flattened " + std::to_string(primary.size()) + "-way";
    if (distinct > 1) s += " over " + std::to_string(distinct) + " blocks";
    return s + replicas;
  }
  // Duplicate boxes with replica_id 0 are replicas too (formats that do not number them).
  std::vector<const Box*> boxes;
  for (const Chunk* c : primary) boxes.push_back(&c->box);
  std::sort(boxes.begin(), boxes.end(), [](const Box* a, const Box* b) {
    return std::tie(a->global_offset, a->local_shape) < std::tie(b->global_offset, b->local_shape);
  });
  boxes.erase(std::unique(boxes.begin(), boxes.end(),
                          [](const Box* a, const Box* b) { return *a == *b; }),
              boxes.end());
  if (replicas.empty() && boxes.size() < primary.size() && primary.size() % boxes.size() == 0) {
    replicas = ", replicated x" + std::to_string(primary.size() / boxes.size());
  }
  if (boxes.size() == 1) {
    const Box& b = *boxes.front();
    if (b == Box::Whole(tensor.global_shape)) return "whole" + replicas;
    return "one chunk " + b.ToString() + replicas;
  }
  std::vector<size_t> split_axes;
  std::vector<std::vector<int64_t>> axis_sizes;
  for (size_t a = 0; a < tensor.global_shape.size(); ++a) {
    std::map<int64_t, int64_t> extents;  // offset -> extent
    for (const Box* b : boxes) extents[b->global_offset[a]] = b->local_shape[a];
    if (extents.size() > 1) {
      split_axes.push_back(a);
      std::vector<int64_t> sizes;
      for (const auto& [off, ext] : extents) sizes.push_back(ext);
      axis_sizes.push_back(sizes);
    }
  }
  if (split_axes.size() == 1) {
    const auto& sizes = axis_sizes[0];
    std::string s = "axis " + std::to_string(split_axes[0]) + " in " +
                    std::to_string(sizes.size()) + (SameExtents(sizes) ? " even" : " uneven") +
                    " chunks";
    if (!SameExtents(sizes)) {
      // Up to 8 extents are listed; beyond that only their range, so a 4096-way split
      // stays one short table cell: "axis 0 in 4096 uneven chunks (1..3 each)".
      if (sizes.size() <= 8) {
        s += " (" + JoinInts(sizes) + ")";
      } else {
        const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
        s += " (" + std::to_string(*lo) + ".." + std::to_string(*hi) + " each)";
      }
    }
    if (boxes.size() != sizes.size()) s += ", irregular";
    return s + replicas;
  }
  std::string grid = "grid ";
  std::string axes;
  for (size_t i = 0; i < split_axes.size(); ++i) {
    grid += (i ? "x" : "") + std::to_string(axis_sizes[i].size());
    axes += (i ? "," : "") + std::to_string(split_axes[i]);
  }
  return grid + " over axes " + axes + replicas;
}

Status RunInspect(const InspectOptions& options, std::ostream& out) {
  // --verify: what a reader would refuse the checkpoint for is recorded and listed with
  // every other problem (fc/format/open_problems.h).
  OpenProblems opened;
  FC_ASSIGN_OR_RETURN(CheckpointIndex index,
                      OpenCheckpoint(options.path,
                                     OpenOptions{.format = options.format,
                                                 .lenient = options.verify ? &opened : nullptr,
                                                 .source_split = options.source_split}));
  std::vector<const TensorEntry*> tensors;
  std::optional<Glob> filter;
  if (!options.tensors.empty()) {
    FC_ASSIGN_OR_RETURN(filter, Glob::Compile(options.tensors).With("--tensors"));
  }
  for (const TensorEntry& t : index.tensors) {
    if (!filter || filter->Matches(t.key)) tensors.push_back(&t);
  }
  if (!options.hf_family.empty()) {
    FC_ASSIGN_OR_RETURN(std::string text,
                        HfFamilyProgram(index, options.hf_family, options.hf_config_dir));
    if (options.print_aoa) {
      out << text;
      return Status::Ok();
    }
    return WriteAoaPreview(index, text, "--hf-family " + options.hf_family, options.json, out);
  }
  if (!options.from_hf_family.empty()) {
    // The program fc-convert --from-hf-family runs (fc/ops/hf_family.h), for the same target.
    std::optional<TargetLayout> like;
    if (!options.target_like.empty()) {
      FC_ASSIGN_OR_RETURN(CheckpointIndex target, OpenCheckpoint(options.target_like));
      FC_ASSIGN_OR_RETURN(like, LayoutFromIndex(target).With("--target-like " +
                                                             options.target_like));
    }
    FC_ASSIGN_OR_RETURN(std::string text,
                        HfFamilyReverseProgram(index, options.from_hf_family,
                                               HfDirOfInput(options.path),
                                               like ? &like->tensors : nullptr));
    if (options.print_aoa) {
      out << text;
      return Status::Ok();
    }
    return WriteAoaPreview(index, text, "--from-hf-family " + options.from_hf_family,
                           options.json, out);
  }
  if (!options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(options.aoa_file, 64 << 20));
    return WriteAoaPreview(index,
                           std::string(reinterpret_cast<const char*>(text.data()), text.size()),
                           options.aoa_file, options.json, out);
  }
  std::optional<VerifyReport> report;
  if (options.verify) {
    FC_ASSIGN_OR_RETURN(report, VerifyCheckpoint(index, &opened));
  }
  if (options.json) {
    WriteJson(index, tensors, report ? &*report : nullptr, out);
  } else {
    PrintSummary(index, options, tensors, out);
    PrintTensorTable(tensors, out);
    PrintObjects(index, out);
    if (report) {
      out << "\nverify: ";
      if (report->problems.empty()) {
        out << "OK: " << report->tensors_checked << " tensors, " << report->chunks_checked
            << " chunks, every element stored exactly once; ";
        // Only fc distcp stores checksums; "0 checksums match" read as a pass of a check
        // that never ran.
        if (index.format == CheckpointFormat::kFcDistcp) {
          out << report->checksums_checked << " checksums (" << HumanBytes(report->bytes_hashed)
              << ") match\n";
        } else {
          out << "no checksums in this format (" << CheckpointFormatName(index.format) << ")\n";
        }
      } else {
        out << report->problem_count << " problem(s)\n";
        uint64_t shown = 0;
        for (const VerifyProblem& p : report->problems) {
          if (shown == static_cast<uint64_t>(std::max(options.max_problems, 0))) break;
          out << "  " << ProblemLine(p) << "\n";
          ++shown;
        }
        if (shown < report->problem_count) {
          out << "  ... and " << report->problem_count - shown << " more\n";
        }
      }
    }
  }
  if (report && !report->problems.empty()) {
    std::string first = ProblemLine(report->problems.front());
    if (report->problem_count > 1) {
      first += " (and " + std::to_string(report->problem_count - 1) + " more)";
    }
    return VerifyFailedError(options.path + ": " + first);
  }
  return Status::Ok();
}

}  // namespace fc
