#include "fc/ops/diff.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "fc/codec/json_writer.h"
#include "fc/core/checked_math.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"
#include "fc/core/glob.h"
#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/ops/report_format.h"
#include "fc/ops/targets.h"

namespace fc {

namespace {

// One side of the comparison. Not movable: outputs point into `index`.
struct Side {
  std::string label;  // "A" or "B"
  CheckpointIndex index;
  std::vector<OutputTensor> outputs;  // after the name filter
  std::map<std::string, size_t> by_name;
};

Status BuildSide(const std::string& label, const std::string& path,
                 std::optional<CheckpointFormat> format, const std::string& aoa_file,
                 const NameFilter& filter, Side& side) {
  side.label = label;
  FC_ASSIGN_OR_RETURN(side.index, OpenCheckpoint(path, format));
  std::vector<OutputTensor> all;
  if (aoa_file.empty()) {
    all = IdentityOutputs(side.index);
  } else {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(aoa_file, 64 << 20));
    FC_ASSIGN_OR_RETURN(
        all, AoaOutputs(side.index,
                        std::string(reinterpret_cast<const char*>(text.data()), text.size()),
                        aoa_file));
  }
  for (OutputTensor& t : all) {
    if (!filter.Passes(t.name)) continue;
    if (side.by_name.count(t.name)) {
      return InvalidArgumentError("output tensor '" + t.name + "' appears twice");
    }
    side.by_name[t.name] = side.outputs.size();
    side.outputs.push_back(std::move(t));
  }
  return Status::Ok();
}

// One element as float64, through the library's conversions (every dtype fc reads but
// complex64, which tolerance mode refuses before any element is compared).
double ElementToDouble(DType dtype, const std::byte* p) {
  double v = std::numeric_limits<double>::quiet_NaN();
  (void)ConvertElements(p, dtype, &v, DType::kFloat64, 1);
  return v;
}

std::string ElementBitsHex(DType dtype, const std::byte* p) {
  uint64_t bits = 0;
  const size_t size = DTypeSize(dtype);
  std::memcpy(&bits, p, size);  // little-endian host (as everywhere in fc)
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIx64, static_cast<int>(size * 2), bits);
  return buf;
}

// The shortest decimal text that reads back as the same value of `dtype`'s width (float
// for types up to 32 bits, double for float64).
std::string FormatFloat(double v, bool is_double) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  int precision = 1;
  for (; precision < 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    const double back = std::strtod(buf, nullptr);
    if (is_double ? back == v : static_cast<float>(back) == static_cast<float>(v)) break;
  }
  // %g switches to an exponent once the exponent reaches the precision ("1e+02"); integral
  // magnitudes below 1e16 read better in full ("100").
  const double magnitude = std::fabs(v);
  if (magnitude >= 1 && magnitude < 1e16) {
    precision = std::max(precision, static_cast<int>(std::floor(std::log10(magnitude))) + 1);
  }
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

std::string FormatElement(DType dtype, const std::byte* p) {
  char buf[40];
  switch (dtype) {
    case DType::kBool: return std::to_integer<uint8_t>(*p) ? "true" : "false";
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      std::snprintf(buf, sizeof buf, "%" PRId64, v);
      return buf;
    }
    case DType::kUInt8: case DType::kInt8: case DType::kInt16: case DType::kInt32:
      std::snprintf(buf, sizeof buf, "%.0f", ElementToDouble(dtype, p));
      return buf;
    default:
      return FormatFloat(ElementToDouble(dtype, p), dtype == DType::kFloat64);
  }
}

// Absolute and relative difference of a (A) against b (B, the reference); both NaN gives
// nullopt (not counted in the maxima).
struct Diffs {
  double abs = 0;
  double rel = 0;
  bool rel_defined = false;
};
std::optional<Diffs> Difference(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return std::nullopt;
  Diffs d;
  const double inf = std::numeric_limits<double>::infinity();
  if (a == b) {
    d.abs = 0;
  } else {
    d.abs = std::fabs(a - b);
    if (std::isnan(d.abs)) d.abs = inf;  // one side NaN
  }
  if (b != 0 && !std::isnan(b)) {
    d.rel = d.abs / std::fabs(b);
    if (std::isnan(d.rel)) d.rel = inf;  // inf / inf
    d.rel_defined = true;
  } else if (std::isnan(b)) {
    d.rel = inf;
    d.rel_defined = true;
  }
  return d;
}

// A tensor present on both sides whose values are compared.
struct Pair {
  const OutputTensor* a;
  const OutputTensor* b;
  std::mutex mu;
  uint64_t differing = 0;
  int64_t first_flat = -1;
  std::string first_a, first_b;
  double first_a_value = 0, first_b_value = 0;
  double max_abs = 0, max_rel = 0;
};

struct SlabTask {
  Pair* pair;
  Box region;
  int64_t first_flat;  // flat index of the region's first element in the tensor
};

// Result of comparing one slab.
struct SlabResult {
  uint64_t differing = 0;
  int64_t first = -1;  // element offset within the slab
  double max_abs = 0, max_rel = 0;
};

void Accumulate(SlabResult& r, double a, double b) {
  if (std::optional<Diffs> d = Difference(a, b)) {
    r.max_abs = std::max(r.max_abs, d->abs);
    if (d->rel_defined) r.max_rel = std::max(r.max_rel, d->rel);
  }
}

SlabResult CompareExact(DType dtype, const std::byte* a, const std::byte* b, size_t count) {
  SlabResult r;
  const size_t es = DTypeSize(dtype);
  if (std::memcmp(a, b, count * es) == 0) return r;
  for (size_t i = 0; i < count; ++i) {
    const std::byte* pa = a + i * es;
    const std::byte* pb = b + i * es;
    if (std::memcmp(pa, pb, es) == 0) continue;
    if (r.differing++ == 0) r.first = static_cast<int64_t>(i);
    Accumulate(r, ElementToDouble(dtype, pa), ElementToDouble(dtype, pb));
  }
  return r;
}

bool Close(double a, double b, double rtol, double atol, bool equal_nan) {
  if (std::isnan(a) || std::isnan(b)) return equal_nan && std::isnan(a) && std::isnan(b);
  if (a == b) return true;  // equal infinities included
  if (std::isinf(a) || std::isinf(b)) return false;
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

SlabResult CompareTolerance(DType da, const std::byte* a, DType db, const std::byte* b,
                            size_t count, double rtol, double atol, bool equal_nan) {
  SlabResult r;
  const size_t sa = DTypeSize(da), sb = DTypeSize(db);
  for (size_t i = 0; i < count; ++i) {
    const double va = ElementToDouble(da, a + i * sa);
    const double vb = ElementToDouble(db, b + i * sb);
    Accumulate(r, va, vb);
    if (!Close(va, vb, rtol, atol, equal_nan) && r.differing++ == 0) {
      r.first = static_cast<int64_t>(i);
    }
  }
  return r;
}

size_t WidestDType(const OutputTensor& t) {
  size_t widest = DTypeSize(t.dtype);
  for (const SourcePiece& piece : t.pieces) {
    if (piece.source) widest = std::max(widest, DTypeSize(piece.source->dtype));
  }
  return widest;
}

Status CheckCoverage(const OutputTensor& t) {
  FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
  for (const SourcePiece& piece : t.pieces) {
    if (piece.source) FC_RETURN_IF_ERROR(CheckSourceCoverage(*piece.source));
  }
  return Status::Ok();
}

const char* KindName(TensorDiff::Kind kind) {
  switch (kind) {
    case TensorDiff::Kind::kOnlyInA: return "only_in_a";
    case TensorDiff::Kind::kOnlyInB: return "only_in_b";
    case TensorDiff::Kind::kDtypeMismatch: return "dtype";
    case TensorDiff::Kind::kShapeMismatch: return "shape";
    case TensorDiff::Kind::kValues: return "values";
  }
  return "?";
}

void AppendJsonNumber(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"nan\"";
  } else if (std::isinf(v)) {
    out += v > 0 ? "\"inf\"" : "\"-inf\"";
  } else {
    out += FormatFloat(v, /*is_double=*/true);  // shortest round-trip text is valid JSON
  }
}

void AppendJsonShape(std::string& out, const Shape& s) {
  out += '[';
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  out += ']';
}

}  // namespace

// Keys first: missing, extra, dtype and shape mismatches need no data. The names on both
// sides whose values are to be compared, as pairs; the others into `report` (one-sided
// names into `one_sided`).
Result<std::vector<std::unique_ptr<Pair>>> PairByName(const Side* a, const Side* b,
                                                      DiffReport& report,
                                                      std::vector<TensorDiff>& one_sided) {
  std::vector<std::unique_ptr<Pair>> pairs;
  for (const OutputTensor& ta : a->outputs) {
    auto it = b->by_name.find(ta.name);
    if (it == b->by_name.end()) {
      TensorDiff d;
      d.kind = TensorDiff::Kind::kOnlyInA;
      d.name = ta.name;
      d.dtype_a = ta.dtype;
      d.shape_a = ta.shape;
      one_sided.push_back(std::move(d));
      continue;
    }
    const OutputTensor& tb = b->outputs[it->second];
    if (report.tolerance_mode &&
        (ta.dtype == DType::kComplex64 || tb.dtype == DType::kComplex64)) {
      return UnimplementedError("tensor '" + ta.name +
                                "' is complex64: --rtol/--atol compare real values; compare "
                                "it exactly (without them) or leave it out with --exclude");
    }
    const bool shape_differs = ta.shape != tb.shape;
    const bool dtype_differs = !report.tolerance_mode && ta.dtype != tb.dtype;
    if (shape_differs || dtype_differs) {
      TensorDiff d;
      d.kind = shape_differs ? TensorDiff::Kind::kShapeMismatch : TensorDiff::Kind::kDtypeMismatch;
      d.name = ta.name;
      d.dtype_a = ta.dtype;
      d.dtype_b = tb.dtype;
      d.shape_a = ta.shape;
      d.shape_b = tb.shape;
      report.differences.push_back(std::move(d));
      continue;
    }
    auto p = std::make_unique<Pair>();
    p->a = &ta;
    p->b = &tb;
    pairs.push_back(std::move(p));
  }
  for (const OutputTensor& tb : b->outputs) {
    if (a->by_name.count(tb.name)) continue;
    TensorDiff d;
    d.kind = TensorDiff::Kind::kOnlyInB;
    d.name = tb.name;
    d.dtype_b = tb.dtype;
    d.shape_b = tb.shape;
    one_sided.push_back(std::move(d));
  }
  return pairs;
}

// What the slabs found, per pair: the compared list and a kValues difference for each pair
// whose values differ.
Status ReportValues(const std::vector<std::unique_ptr<Pair>>& pairs, DiffReport& report) {
  for (const auto& p : pairs) {
    report.compared.push_back({p->a->name, p->max_abs, p->max_rel});
    if (p->differing == 0) continue;
    TensorDiff d;
    d.kind = TensorDiff::Kind::kValues;
    d.name = p->a->name;
    d.dtype_a = p->a->dtype;
    d.dtype_b = p->b->dtype;
    d.shape_a = p->a->shape;
    d.shape_b = p->b->shape;
    d.differing_elements = p->differing;
    FC_ASSIGN_OR_RETURN(uint64_t elements, CheckedByteSize(p->a->shape, 1));
    d.elements = elements;
    d.first_index = p->a->shape.empty() ? Shape{} : Unravel(p->first_flat, p->a->shape);
    d.first_a = p->first_a;
    d.first_b = p->first_b;
    d.first_a_value = p->first_a_value;
    d.first_b_value = p->first_b_value;
    d.max_abs_diff = p->max_abs;
    d.max_rel_diff = p->max_rel;
    report.differences.push_back(std::move(d));
  }
  return Status::Ok();
}

Result<DiffReport> RunDiff(const DiffOptions& options) {
  DiffReport report;
  report.tolerance_mode = options.rtol.has_value() || options.atol.has_value();
  const double rtol = options.rtol.value_or(0.0);
  const double atol = options.atol.value_or(0.0);
  if (!(rtol >= 0) || !(atol >= 0) || std::isinf(rtol) || std::isinf(atol)) {
    return InvalidArgumentError("--rtol " + std::to_string(rtol) + " / --atol " +
                                std::to_string(atol) + ": tolerances must be finite and >= 0");
  }
  FC_ASSIGN_OR_RETURN(NameFilter filter, NameFilter::Compile(options.include, options.exclude));
  auto a = std::make_unique<Side>();
  auto b = std::make_unique<Side>();
  FC_RETURN_IF_ERROR_WITH(
      BuildSide("A", options.a, options.format_a, options.aoa_a, filter, *a), "A");
  FC_RETURN_IF_ERROR_WITH(
      BuildSide("B", options.b, options.format_b, options.aoa_b, filter, *b), "B");
  report.tensors_a = a->outputs.size();
  report.tensors_b = b->outputs.size();
  report.only_common = options.only_common;
  // A name on one side only: a difference, or (only_common) listed apart.
  std::vector<TensorDiff>& one_sided = options.only_common ? report.unmatched : report.differences;

  FC_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Pair>> pairs,
                      PairByName(a.get(), b.get(), report, one_sided));
  // Everything compared must be readable in full before any data is read.
  for (const auto& p : pairs) {
    FC_RETURN_IF_ERROR_WITH(CheckCoverage(*p->a), "A");
    FC_RETURN_IF_ERROR_WITH(CheckCoverage(*p->b), "B");
  }

  const int threads = WorkerThreads(options.threads);
  const uint64_t budget =
      options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  // The workers' direct IO buffers (fc/io/env.h) when the budget affords them without
  // shrinking the workers' slabs below kMaxSlabBytes (as fc/plan/plan.h has it); else the
  // workers read through the page cache. Per worker, of the rest: one slab of each side plus
  // up to two staging copies of a source block inside AssembleRegion (which runs for one
  // side at a time).
  const uint64_t io_buffers = static_cast<uint64_t>(threads) * DirectIoBufferBytes();
  const bool direct_io =
      io_buffers > 0 &&
      budget >= io_buffers + static_cast<uint64_t>(threads) * 4 * kMaxSlabBytes;
  const uint64_t per_worker =
      (budget - (direct_io ? io_buffers : 0)) / static_cast<uint64_t>(threads) / 4;
  if (per_worker < 64) {
    return ResourceExhaustedError("--memory-budget " + std::to_string(budget) +
                                  " bytes is too small for " + std::to_string(threads) +
                                  " threads");
  }
  std::vector<SlabTask> tasks;
  uint64_t total_bytes = 0;
  for (const auto& p : pairs) {
    const OutputTensor& ta = *p->a;
    const OutputTensor& tb = *p->b;
    FC_ASSIGN_OR_RETURN(uint64_t bytes_a, CheckedByteSize(ta.shape, DTypeSize(ta.dtype)));
    FC_ASSIGN_OR_RETURN(uint64_t bytes_b, CheckedByteSize(tb.shape, DTypeSize(tb.dtype)));
    total_bytes += bytes_a + bytes_b;
    report.bytes_compared += bytes_a;
    const uint64_t widest = std::max(WidestDType(ta), WidestDType(tb));
    const uint64_t slab_bytes = std::min(per_worker, kMaxSlabBytes);
    const int64_t max_elements = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / widest));
    for (Box& slab : ContiguousSlabs(Box::Whole(ta.shape), max_elements)) {
      const int64_t first = slab.rank() ? Ravel(slab.global_offset, ta.shape) : 0;
      tasks.push_back({p.get(), std::move(slab), first});
    }
  }
  report.tensors_compared = pairs.size();

  Progress progress("comparing", total_bytes, options.progress);
  ChunkReader reader_a(a->index);
  ChunkReader reader_b(b->index);
  struct Buffers {
    std::vector<std::byte> a, b;
  };
  std::vector<Buffers> buffers(static_cast<size_t>(threads));
  Status status = ParallelFor(tasks.size(), threads, [&](size_t i, int worker) -> Status {
    const ScopedThreadDirectIo direct(direct_io);
    Buffers& buf = buffers[static_cast<size_t>(worker)];
    const SlabTask& task = tasks[i];
    Pair& p = *task.pair;
    const size_t count = static_cast<size_t>(task.region.num_elements());
    const DType da = p.a->dtype, db = p.b->dtype;
    buf.a.resize(count * DTypeSize(da));
    buf.b.resize(count * DTypeSize(db));
    FC_RETURN_IF_ERROR_WITH(
        AssembleRegion(reader_a, p.a->name, p.a->pieces, task.region, da, buf.a.data()), "A");
    FC_RETURN_IF_ERROR_WITH(
        AssembleRegion(reader_b, p.b->name, p.b->pieces, task.region, db, buf.b.data()), "B");
    const SlabResult r =
        report.tolerance_mode
            ? CompareTolerance(da, buf.a.data(), db, buf.b.data(), count, rtol, atol,
                               options.equal_nan)
            : CompareExact(da, buf.a.data(), buf.b.data(), count);
    progress.Add(buf.a.size() + buf.b.size());
    if (r.differing == 0 && r.max_abs == 0 && r.max_rel == 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(p.mu);
    p.differing += r.differing;
    p.max_abs = std::max(p.max_abs, r.max_abs);
    p.max_rel = std::max(p.max_rel, r.max_rel);
    if (r.first >= 0 && (p.first_flat < 0 || task.first_flat + r.first < p.first_flat)) {
      p.first_flat = task.first_flat + r.first;
      const std::byte* ea = buf.a.data() + static_cast<size_t>(r.first) * DTypeSize(da);
      const std::byte* eb = buf.b.data() + static_cast<size_t>(r.first) * DTypeSize(db);
      p.first_a = FormatElement(da, ea);
      p.first_b = FormatElement(db, eb);
      // Same text, different bits (NaN payloads, or values beyond the printed precision):
      // show the bits too.
      if (p.first_a == p.first_b) {
        p.first_a += " (" + ElementBitsHex(da, ea) + ")";
        p.first_b += " (" + ElementBitsHex(db, eb) + ")";
      }
      p.first_a_value = ElementToDouble(da, ea);
      p.first_b_value = ElementToDouble(db, eb);
    }
    return Status::Ok();
  });
  // Checksums of chunks read only in part (fc distcp), before any result is reported.
  if (status.ok()) status = reader_a.FinishVerification().With("A");
  if (status.ok()) status = reader_b.FinishVerification().With("B");
  progress.Finish(status.ok());
  FC_RETURN_IF_ERROR(status);

  FC_RETURN_IF_ERROR(ReportValues(pairs, report));
  auto by_name_then_kind = [](const TensorDiff& x, const TensorDiff& y) {
    if (x.name != y.name) return x.name < y.name;
    return static_cast<int>(x.kind) < static_cast<int>(y.kind);
  };
  std::stable_sort(report.differences.begin(), report.differences.end(), by_name_then_kind);
  std::stable_sort(report.unmatched.begin(), report.unmatched.end(), by_name_then_kind);
  return report;
}

void WriteDiffText(const DiffReport& report, std::ostream& out) {
  for (const TensorDiff& d : report.unmatched) {
    const bool in_a = d.kind == TensorDiff::Kind::kOnlyInA;
    out << "not compared, only in " << (in_a ? "A: '" : "B: '") << d.name << "' "
        << DTypeName(in_a ? d.dtype_a : d.dtype_b) << " " << ShapeText(in_a ? d.shape_a : d.shape_b)
        << "\n";
  }
  for (const TensorDiff& d : report.differences) {
    switch (d.kind) {
      case TensorDiff::Kind::kOnlyInA:
        out << "only in A: '" << d.name << "' " << DTypeName(d.dtype_a) << " "
            << ShapeText(d.shape_a) << "\n";
        break;
      case TensorDiff::Kind::kOnlyInB:
        out << "only in B: '" << d.name << "' " << DTypeName(d.dtype_b) << " "
            << ShapeText(d.shape_b) << "\n";
        break;
      case TensorDiff::Kind::kDtypeMismatch:
        out << "dtype differs: '" << d.name << "' A " << DTypeName(d.dtype_a) << ", B "
            << DTypeName(d.dtype_b) << "\n";
        break;
      case TensorDiff::Kind::kShapeMismatch:
        out << "shape differs: '" << d.name << "' A " << ShapeText(d.shape_a) << ", B "
            << ShapeText(d.shape_b) << "\n";
        break;
      case TensorDiff::Kind::kValues: {
        out << "values differ: '" << d.name << "' " << ShapeText(d.shape_a) << " "
            << DTypeName(d.dtype_a);
        if (d.dtype_b != d.dtype_a) out << " vs " << DTypeName(d.dtype_b);
        std::string abs_text = FormatFloat(d.max_abs_diff, true);
        std::string rel_text = FormatFloat(d.max_rel_diff, true);
        out << ": " << d.differing_elements << " of " << d.elements
            << " elements; first at " << ShapeText(d.first_index) << ": A=" << d.first_a
            << " B=" << d.first_b << "; max abs diff " << abs_text << ", max rel diff "
            << rel_text << "\n";
        break;
      }
    }
  }
  std::string largest;
  if (report.tolerance_mode && !report.compared.empty()) {
    const TensorStats* abs = &report.compared[0];
    const TensorStats* rel = &report.compared[0];
    for (const TensorStats& t : report.compared) {
      if (t.max_abs_diff > abs->max_abs_diff) abs = &t;
      if (t.max_rel_diff > rel->max_rel_diff) rel = &t;
    }
    // A tensor is named only when it differs at all: "largest abs diff 0 ('w')" would
    // single out one of several equal tensors.
    auto named = [](const TensorStats& t, double v) {
      return FormatFloat(v, true) + (v > 0 ? " ('" + t.name + "')" : std::string());
    };
    largest = "; largest abs diff " + named(*abs, abs->max_abs_diff) + ", largest rel diff " +
              named(*rel, rel->max_rel_diff);
  }
  std::string not_compared;
  if (!report.unmatched.empty()) {
    not_compared = "; " + std::to_string(report.unmatched.size()) +
                   " name(s) on one side only, not compared (--only-common)";
  }
  if (report.NothingInCommon()) {
    out << "different: no name in common (A has " << report.tensors_a << ", B has "
        << report.tensors_b << "); nothing compared\n";
  } else if (report.equal()) {
    out << "equal: " << report.tensors_compared << " tensors ("
        << HumanBytes(report.bytes_compared) << ") "
        << (report.tolerance_mode ? "within tolerance" : "bit-identical") << largest
        << not_compared << "\n";
  } else {
    out << "different: " << report.differences.size() << " difference(s); "
        << report.tensors_compared << " tensors compared, A has " << report.tensors_a
        << ", B has " << report.tensors_b << largest << not_compared << "\n";
  }
}

namespace {

// One TensorDiff as a JSON object (see DiffReportJson); members of a side that lacks the
// tensor are left out.
void AppendDiffJson(std::string& o, const TensorDiff& d) {
  o += "{\"kind\":\"";
  o += KindName(d.kind);
  o += "\",\"name\":";
  AppendJsonString(&o, d.name);
  const bool has_a = d.kind != TensorDiff::Kind::kOnlyInB;
  const bool has_b = d.kind != TensorDiff::Kind::kOnlyInA;
  if (has_a) {
    o += ",\"dtype_a\":";
    AppendJsonString(&o, DTypeName(d.dtype_a));
  }
  if (has_b) {
    o += ",\"dtype_b\":";
    AppendJsonString(&o, DTypeName(d.dtype_b));
  }
  if (has_a) {
    o += ",\"shape_a\":";
    AppendJsonShape(o, d.shape_a);
  }
  if (has_b) {
    o += ",\"shape_b\":";
    AppendJsonShape(o, d.shape_b);
  }
  if (d.kind == TensorDiff::Kind::kValues) {
    o += ",\"elements\":" + std::to_string(d.elements);
    o += ",\"differing_elements\":" + std::to_string(d.differing_elements);
    o += ",\"first_index\":";
    AppendJsonShape(o, d.first_index);
    o += ",\"first_a\":";
    AppendJsonString(&o, d.first_a);
    o += ",\"first_b\":";
    AppendJsonString(&o, d.first_b);
    o += ",\"first_a_value\":";
    AppendJsonNumber(o, d.first_a_value);
    o += ",\"first_b_value\":";
    AppendJsonNumber(o, d.first_b_value);
    o += ",\"max_abs_diff\":";
    AppendJsonNumber(o, d.max_abs_diff);
    o += ",\"max_rel_diff\":";
    AppendJsonNumber(o, d.max_rel_diff);
  }
  o += '}';
}

}  // namespace

std::string DiffReportJson(const DiffReport& report) {
  std::string o = "{\"equal\":";
  o += report.equal() ? "true" : "false";
  o += ",\"mode\":";
  o += report.tolerance_mode ? "\"tolerance\"" : "\"exact\"";
  o += ",\"tensors_a\":" + std::to_string(report.tensors_a);
  o += ",\"tensors_b\":" + std::to_string(report.tensors_b);
  o += ",\"tensors_compared\":" + std::to_string(report.tensors_compared);
  o += ",\"bytes_compared\":" + std::to_string(report.bytes_compared);
  o += ",\"differences\":[";
  bool first = true;
  for (const TensorDiff& d : report.differences) {
    if (!first) o += ',';
    first = false;
    AppendDiffJson(o, d);
  }
  o += "],\"tensors\":[";
  first = true;
  for (const TensorStats& t : report.compared) {
    if (!first) o += ',';
    first = false;
    o += "{\"name\":";
    AppendJsonString(&o, t.name);
    o += ",\"max_abs_diff\":";
    AppendJsonNumber(o, t.max_abs_diff);
    o += ",\"max_rel_diff\":";
    AppendJsonNumber(o, t.max_rel_diff);
    o += '}';
  }
  o += ']';
  if (report.only_common) {
    o += ",\"unmatched\":[";
    first = true;
    for (const TensorDiff& d : report.unmatched) {
      if (!first) o += ',';
      first = false;
      AppendDiffJson(o, d);
    }
    o += ']';
  }
  o += '}';
  return o;
}

}  // namespace fc
