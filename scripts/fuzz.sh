#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang with ASan+UBSan, in build-fuzz) and runs each
# for SECONDS (default 60) on its seed corpus (fuzz/make_corpus.py, from testdata/).
# Fails if any harness finds a crash, a leak, a timeout or an out-of-memory; the input is
# left in build-fuzz/artifacts/<harness>-crash-*, to be replayed with
#   build-fuzz/fuzz/<harness> build-fuzz/artifacts/<harness>-crash-...
# Usage: scripts/fuzz.sh [SECONDS] [HARNESS...]   (default: every harness in fuzz/)
# The corpora grow in build-fuzz/corpus/<harness> across runs; delete it to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
build=build-fuzz
if [[ ! -f "$build/build.ninja" ]]; then
  CC="${FUZZ_CC:-clang}" CXX="${FUZZ_CXX:-clang++}" meson setup "$build" -Dfuzz=enabled \
    -Dtests=disabled -Dmpi=disabled -Dnccl=disabled -Dbuildtype=plain \
    -Dcpp_args='-O1 -gline-tables-only' >/dev/null
fi
ninja -C "$build" fuzzers
python3 fuzz/make_corpus.py "$build/corpus" >/dev/null
mkdir -p "$build/artifacts" "$build/logs"
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  for f in fuzz/*_fuzzer.cc; do harnesses+=("$(basename "$f" .cc)"); done
fi
failed=()
for h in "${harnesses[@]}"; do
  mkdir -p "$build/corpus/$h"
  echo "== $h: ${seconds}s"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$build/fuzz/$h" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$build/artifacts/$h-" "$build/corpus/$h" \
      >"$build/logs/$h.log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/logs/$h.log" | tr '\n' ' '
    echo
  else
    tail -n 40 "$build/logs/$h.log"
    failed+=("$h")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: crashes in: ${failed[*]} (inputs in $build/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, ${seconds}s each, no crash"
