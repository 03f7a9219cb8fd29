// fc-diff's library entry point: compares two checkpoints of any formats and layouts tensor
// by tensor, optionally through an AOA program on either side, streaming under a memory
// budget.
//
// What is compared: the output tensors of each side (IdentityOutputs, or AoaOutputs when the
// side has a program), matched by name, after the --include/--exclude globs (fc/core/glob.h).
// Names only on one side are reported as missing/extra. For a name on both sides:
//
//   exact mode (default, no tolerance given): dtypes and shapes must be equal, and the
//     bytes of every element equal. So -0.0 differs from 0.0, and NaN equals NaN only when
//     the bit patterns are the same.
//   tolerance mode (rtol or atol given): shapes must be equal; dtypes may differ (e.g. a
//     bfloat16 export against its float32 source). Each element is converted to float64
//     (int64 beyond 2^53 rounds) and a (side A) is close to b (side B, the reference) when
//         |a - b| <= atol + rtol * |b|          (numpy.isclose)
//     Infinities are close only to the same infinity; NaN is close to NaN only with
//     equal_nan, never to a number.
//
// For a tensor whose values differ the report carries the number of differing elements,
// the first one in row-major order (multi-index and both values), and the largest absolute
// and relative (|a - b| / |b|, over elements with b != 0) differences over all elements that
// are not both NaN. Non-finite differences (inf vs a number) count as +inf.
//
// Thread-safety: RunDiff may be called concurrently on different options.
#ifndef FC_OPS_DIFF_H_
#define FC_OPS_DIFF_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/exec/progress.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct DiffOptions {
  std::string a;                             // checkpoint A (directory or file)
  std::string b;                             // checkpoint B (the reference for rtol)
  std::optional<CheckpointFormat> format_a;  // forced formats
  std::optional<CheckpointFormat> format_b;
  std::string aoa_a;                         // AOA program file applied to A (optional)
  std::string aoa_b;                         // AOA program file applied to B (optional)
  std::optional<double> rtol;                // tolerance mode when rtol or atol is set;
  std::optional<double> atol;                //   the unset one is 0
  bool equal_nan = false;                    // tolerance mode: NaN close to NaN
  // Compare only the names both sides hold: a name on one side only is listed in
  // DiffReport::unmatched instead of being a difference (fc-diff --only-common, e.g. an
  // export against its source, which also holds optimizer states). Sides with no name in
  // common are still different (nothing was compared).
  bool only_common = false;
  std::vector<std::string> include;          // globs; a name is kept if it matches any
  std::vector<std::string> exclude;          // globs; a name is dropped if it matches any
  uint64_t memory_budget = 0;                // bytes of tensor data; 0: a quarter of RAM
  int threads = 0;                           // 0: hardware concurrency (at most 8)
  Progress::Mode progress = Progress::Mode::kAuto;
};

struct TensorDiff {
  enum class Kind {
    kOnlyInA,         // missing from B
    kOnlyInB,         // missing from A
    kDtypeMismatch,   // exact mode only; values not compared
    kShapeMismatch,   // values not compared
    kValues,          // values differ
  };
  Kind kind = Kind::kValues;
  std::string name;
  DType dtype_a = DType::kFloat32;  // for kOnlyInB: unset
  DType dtype_b = DType::kFloat32;  // for kOnlyInA: unset
  Shape shape_a;
  Shape shape_b;
  // kValues only:
  uint64_t differing_elements = 0;
  uint64_t elements = 0;
  Shape first_index;         // multi-index of the first differing element (row-major)
  std::string first_a;       // its value in A, e.g. "0.5" or "nan (0x7fc00000)"
  std::string first_b;       // its value in B
  double first_a_value = 0;  // the same as float64
  double first_b_value = 0;
  double max_abs_diff = 0;   // over all elements (see the header comment)
  double max_rel_diff = 0;
};

// The largest differences seen in one compared tensor (also when it is equal within the
// tolerance; in exact mode an equal tensor has 0 and 0).
struct TensorStats {
  std::string name;
  double max_abs_diff = 0;
  double max_rel_diff = 0;
};

struct DiffReport {
  bool tolerance_mode = false;
  uint64_t tensors_a = 0;        // output tensors of A after the name filter
  uint64_t tensors_b = 0;
  uint64_t tensors_compared = 0;  // on both sides with comparable dtype and shape
  uint64_t bytes_compared = 0;   // bytes of A's tensors whose values were compared
  std::vector<TensorDiff> differences;  // sorted by name (then kind)
  std::vector<TensorStats> compared;    // every compared tensor, in A's order
  // only_common: the names on one side only (kOnlyInA / kOnlyInB), sorted by name; not
  // differences.
  bool only_common = false;
  std::vector<TensorDiff> unmatched;

  // Equal when nothing differs, and, with only_common, at least one name was in common
  // (so that two unrelated checkpoints are never "equal").
  bool equal() const { return differences.empty() && !NothingInCommon(); }
  bool NothingInCommon() const {
    return only_common && !unmatched.empty() && unmatched.size() == tensors_a + tensors_b;
  }
};

// Opens both checkpoints, builds each side's outputs, checks that every compared tensor is
// fully covered by its pieces (and its sources by their chunks), then compares values slab
// by slab (ContiguousSlabs under the budget, ParallelFor).
// Errors: those of opening the inputs (kNotFound, kDataLoss, kUnimplemented, ...); AOA
// program errors (kInvalidArgument); kInvalidArgument for bad globs or a negative or NaN
// tolerance; kResourceExhausted when the budget is too small for the threads; read errors
// with the tensor named. The error message says which side ("A: ..." / "B: ...").
Result<DiffReport> RunDiff(const DiffOptions& options);

// Human-readable report: one block per difference, e.g.
//   values differ: 'w' [4, 6] float32: 3 of 24 elements; first at [1, 2]: A=0.5 B=0.25;
//     max abs diff 0.25, max rel diff 1
//   only in A: 'x' float32 [4]
// then a summary line ("different: 2 difference(s); ..." / "equal: 12 tensors (3.0 KiB)
// bit-identical"); with only_common, the unmatched names first ("not compared, only in A:
// 'x' float32 [4]") and their count in the summary; in tolerance mode it also names the largest absolute and relative
// differences and their tensors.
void WriteDiffText(const DiffReport& report, std::ostream& out);

// Compact JSON object:
//   {"equal":false,"mode":"exact"|"tolerance","tensors_a":N,"tensors_b":N,
//    "tensors_compared":N,"bytes_compared":N,
//    "differences":[{"kind":"values"|"only_in_a"|"only_in_b"|"dtype"|"shape","name":...,
//      "dtype_a":...,"dtype_b":...,"shape_a":[...],"shape_b":[...],
//      (values only:) "elements":N,"differing_elements":N,"first_index":[...],
//      "first_a":"0.5","first_b":"0.25","first_a_value":0.5,"first_b_value":0.25,
//      "max_abs_diff":0.25,"max_rel_diff":1}],
//    "tensors":[{"name":"w","max_abs_diff":0.25,"max_rel_diff":1}],   (= compared)
//    (only_common:) "unmatched":[{"kind":"only_in_a","name":...,"dtype_a":...,...}]}
// Members of a side that lacks the tensor are left out. Numbers that are not finite are
// written as the strings "nan", "inf", "-inf" (JSON has no such numbers).
std::string DiffReportJson(const DiffReport& report);

}  // namespace fc

#endif  // FC_OPS_DIFF_H_
