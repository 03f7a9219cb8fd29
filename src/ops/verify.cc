#include "fc/ops/verify.h"

#include <algorithm>
#include <tuple>

#include "fc/core/box_cover.h"
#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/ops/report_format.h"

namespace fc {
namespace {

// Every problem goes through here: counted always, listed up to kMaxListedProblems.
void Add(VerifyReport& report, VerifyProblem problem) {
  ++report.problem_count;
  if (report.problems.size() < kMaxListedProblems) report.problems.push_back(std::move(problem));
}

std::string ChunkName(const Chunk& chunk) {
  std::string s = "chunk " + chunk.box.ToString();
  if (chunk.flat_range) s += " flat " + chunk.flat_range->ToString();
  if (chunk.replica_id != 0) s += " replica " + std::to_string(chunk.replica_id);
  return s;
}

// The boxes (global coordinates) whose elements a chunk stores.
std::vector<Box> StoredBoxes(const Chunk& chunk) {
  if (!chunk.flat_range) return {chunk.box};
  std::vector<Box> pieces = DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range);
  for (Box& p : pieces) {
    for (size_t i = 0; i < p.rank(); ++i) p.global_offset[i] += chunk.box.global_offset[i];
  }
  return pieces;
}

void CheckCoverage(const CheckpointIndex& index, const TensorEntry& t, VerifyReport& report) {
  auto problem = [&](const std::string& file, std::string what) {
    Add(report, {file, t.key, std::move(what)});
  };
  Result<int64_t> numel = CheckedNumElements(t.global_shape);
  if (!numel.ok()) {
    problem("", "global shape: " + numel.status().message());
    return;
  }
  std::vector<Box> pieces;
  for (const Chunk& c : t.chunks) {
    const std::string& file = c.file < index.files.size() ? index.files[c.file].path : "";
    Status box_ok = ValidateBox(c.box, t.global_shape);
    if (!box_ok.ok()) {
      problem(file, ChunkName(c) + ": " + box_ok.message());
      continue;
    }
    if (c.flat_range && (!c.flat_range->SatisfiesInvariants() ||
                         c.flat_range->exclusive_max > c.box.num_elements())) {
      problem(file, ChunkName(c) + ": flattened range outside its box of " +
                        std::to_string(c.box.num_elements()) + " elements");
      continue;
    }
    if (c.replica_id != 0) continue;
    for (Box& p : StoredBoxes(c)) {
      if (!p.empty()) pieces.push_back(std::move(p));
    }
  }
  const CoverReport cover = CheckCover(Box::Whole(t.global_shape), pieces);
  for (const auto& [a, b] : cover.overlaps) {
    if (auto o = Intersect(a, b)) {
      problem("", "elements " + o->ToString() + " stored twice (" + a.ToString() + " and " +
                      b.ToString() + ")");
    }
  }
  if (cover.overlap_count > cover.overlaps.size()) {
    problem("", std::to_string(cover.overlap_count - cover.overlaps.size()) +
                    " more overlapping pairs");
  }
  // Gaps are measured on pieces that do not overlap; a tensor with overlaps gets a second
  // pass without exact duplicates (a chunk listed twice where another is missing), so both
  // problems are reported. Other overlaps leave its gaps unmeasured.
  const CoverReport* gaps = cover.overlap_count == 0 ? &cover : nullptr;
  CoverReport distinct;
  if (cover.overlap_count > 0) {
    auto less = [](const Box& a, const Box& b) {
      return std::tie(a.global_offset, a.local_shape) < std::tie(b.global_offset, b.local_shape);
    };
    std::sort(pieces.begin(), pieces.end(), less);
    pieces.erase(std::unique(pieces.begin(), pieces.end()), pieces.end());
    distinct = CheckCover(Box::Whole(t.global_shape), std::move(pieces));
    if (distinct.overlap_count == 0) gaps = &distinct;
  }
  if (gaps && gaps->covered_elements < gaps->whole_elements) {
    std::string what = "only " + std::to_string(gaps->covered_elements) + " of " +
                       std::to_string(gaps->whole_elements) + " elements stored";
    if (!gaps->missing.empty()) {
      what += "; missing";
      for (const Box& m : gaps->missing) what += " " + m.ToString();
    }
    problem("", what);
  }
}

// Bytes the chunk's data region must span.
Result<uint64_t> ExpectedByteLength(const TensorEntry& t, const Chunk& c, const Shape& strides) {
  const uint64_t esize = DTypeSize(t.dtype);
  if (strides.empty()) {
    auto n = CheckedMulU(static_cast<uint64_t>(c.stored_elements()), esize);
    if (!n) return OutOfRangeError("byte size overflows");
    return *n;
  }
  if (strides.size() != c.box.rank()) {
    return DataLossError("strides rank " + std::to_string(strides.size()) + " != box rank " +
                         std::to_string(c.box.rank()));
  }
  if (c.box.empty()) return uint64_t{0};
  int64_t last = 0;
  for (size_t i = 0; i < c.box.rank(); ++i) {
    if (strides[i] < 0) return DataLossError("negative stride");
    auto step = CheckedMul(c.box.local_shape[i] - 1, strides[i]);
    if (!step || !(step = CheckedAdd(last, *step))) return OutOfRangeError("stride extent overflows");
    last = *step;
  }
  auto n = CheckedMulU(static_cast<uint64_t>(last) + 1, esize);
  if (!n) return OutOfRangeError("byte size overflows");
  return *n;
}

void CheckByteRange(const CheckpointIndex& index, const std::string& key, const std::string& what,
                    uint32_t file, uint64_t offset, uint64_t length, VerifyReport& report) {
  if (file >= index.files.size()) {
    Add(report, {"", key, what + ": file index " + std::to_string(file) +
                                            " out of range"});
    return;
  }
  const FileInfo& f = index.files[file];
  auto end = CheckedAddU(offset, length);
  if (!end || *end > f.size) {
    Add(report,
        {f.path, key, what + ": bytes [" + std::to_string(offset) + ", " +
                          (end ? std::to_string(*end) : std::string("overflow")) +
                          ") pass the end of the file (" + std::to_string(f.size) + " bytes)"});
  }
}

std::string Hex(uint64_t v) { return HexU64(v); }
void CheckChecksum(ChunkReader& reader, const CheckpointIndex& index, const std::string& key,
                   const std::string& what, uint32_t file, uint64_t offset, uint64_t length,
                   uint64_t expected, VerifyReport& report) {
  const std::string& path = file < index.files.size() ? index.files[file].path : "";
  Result<uint64_t> got = [&]() -> Result<uint64_t> {
    FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(file));
    return Xxh3OfFileRange(*f, offset, length);
  }();
  if (got.ok()) {
    report.bytes_hashed += length;
    ++report.checksums_checked;
  }
  if (!got.ok()) {
    Add(report, {path, key, what + ": " + got.status().message()});
  } else if (*got != expected) {
    Add(report, {path, key, what + ": xxh3-64 of the bytes is " + Hex(*got) +
                                              ", the metadata says " + Hex(expected)});
  }
}

}  // namespace

Result<VerifyReport> VerifyCheckpoint(const CheckpointIndex& index,
                                      const OpenProblems* opened) {
  VerifyReport report;
  if (opened) {
    for (const OpenProblem& p : opened->listed) Add(report, {p.file, p.key, p.what});
    // Those the reader counted but did not list.
    report.problem_count += opened->count - opened->listed.size();
  }
  ChunkReader reader(index);
  for (uint32_t i = 0; i < index.files.size(); ++i) {
    Result<const RandomAccessFile*> f = reader.File(i);
    if (!f.ok()) {
      Add(report, {index.files[i].path, "", f.status().message()});
    } else if ((*f)->size() != index.files[i].size) {
      Add(report, {index.files[i].path, "", "file is " +
                                 std::to_string((*f)->size()) + " bytes, was " +
                                 std::to_string(index.files[i].size) + " when opened"});
    }
  }
  for (const TensorEntry& t : index.tensors) {
    ++report.tensors_checked;
    CheckCoverage(index, t, report);
    for (const Chunk& c : t.chunks) {
      ++report.chunks_checked;
      const std::string what = ChunkName(c);
      // A chunk opened unlocated (torch DCP) is located here: a corrupt item is reported
      // with its file and tensor (the message names the chunk and item bytes).
      Result<ChunkLocation> place = reader.Locate(t, c);
      if (!place.ok()) {
        const std::string path = c.file < index.files.size() ? index.files[c.file].path : "";
        // The problem line names the file and key already: "F: tensor 'K' chunk ..." is
        // shortened to "chunk ...".
        std::string message = place.status().message();
        const std::string named = path + ": tensor '" + t.key + "' ";
        if (message.compare(0, named.size(), named) == 0) message.erase(0, named.size());
        Add(report, {path, t.key, std::move(message)});
        continue;
      }
      Result<uint64_t> expected = ExpectedByteLength(t, c, place->strides);
      if (!expected.ok()) {
        Add(report, {"", t.key, what + ": " + expected.status().message()});
        continue;
      }
      if (*expected > place->byte_length) {
        Add(report,
            {c.file < index.files.size() ? index.files[c.file].path : "", t.key,
             what + ": needs " + std::to_string(*expected) + " bytes of " +
                 std::string(DTypeName(t.dtype)) + ", the metadata gives " +
                 std::to_string(place->byte_length)});
      }
      const uint64_t before = report.problem_count;
      // An encoded item's data place is in the decoded item (checked when located): the
      // file holds the encoded range.
      if (c.encoded_item) {
        CheckByteRange(index, t.key, what, c.file, c.encoded_item->encoded_offset,
                       c.encoded_item->encoded_length, report);
      } else {
        CheckByteRange(index, t.key, what, c.file, place->byte_offset, place->byte_length,
                       report);
      }
      if (c.xxh3_64 && report.problem_count == before) {
        CheckChecksum(reader, index, t.key, what, c.file, place->byte_offset,
                      place->byte_length, *c.xxh3_64, report);
      }
    }
  }
  for (const ObjectEntry& o : index.objects) {
    const uint64_t before = report.problem_count;
    if (o.encoded_item) {
      CheckByteRange(index, o.key, "object", o.file, o.encoded_item->encoded_offset,
                     o.encoded_item->encoded_length, report);
    } else {
      CheckByteRange(index, o.key, "object", o.file, o.byte_offset, o.byte_length, report);
    }
    if (o.xxh3_64 && report.problem_count == before) {
      CheckChecksum(reader, index, o.key, "object", o.file, o.byte_offset, o.byte_length,
                    *o.xxh3_64, report);
    }
  }
  return report;
}

}  // namespace fc
