#!/usr/bin/env bash
# The real frameworks as the oracle: creates or reuses the interop virtual environments
# (outside the repository), installs the pinned framework versions into them, builds fc with
# its tests, and runs the Meson suite `real` (fc against the real torch, transformers, ...).
#
# usage: scripts/interop.sh [--setup-only] [MESON TEST ARGS...]
#   --setup-only   create/update the environments and stop (no build, no tests)
#
# Environments live in $FC_INTEROP_DIR (default ~/.cache/fc-interop), one per group of
# frameworks that install together: <dir>/<env>/ is a venv made from Debian's python3,
# installed from scripts/interop/<env>.txt, then <env>.no-build-isolation.txt (sdists whose
# setup.py imports the first file's packages), under scripts/interop/<env>-constraints.txt
# (exact versions). An environment is reused while its requirement and constraint files are
# unchanged (<dir>/<env>/.fc-installed holds their checksum). A failed install leaves
# <dir>/<env>.failed with pip's error: the tests that need that environment then fail with
# it under CI=true, and skip (exit 77) naming this script elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_only=0
if [[ "${1:-}" == "--setup-only" ]]; then setup_only=1; shift; fi
dir="${FC_INTEROP_DIR:-$HOME/.cache/fc-interop}"
envs=(torch paddle)

# Debian's python3 with venv and headers (DeepSpeed's JIT ops build against them), g++.
scripts/install-deps.sh --with-torch
extra=()
for p in python3-venv python3-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || extra+=("$p")
done
if ((${#extra[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${extra[@]}"
fi

# pip with retries: a network error (a reset, a timeout) is tried again, up to 4 times.
pip_retry() {
  local venv=$1 log=$2; shift 2
  local attempt
  for attempt in 1 2 3 4; do
    if "$venv/bin/pip" install --disable-pip-version-check --progress-bar off "$@" >>"$log" 2>&1; then
      return 0
    fi
    echo "  pip failed (attempt $attempt of 4), see $log" >&2
    sleep $((attempt * 10))
  done
  return 1
}

mkdir -p "$dir"
for env in "${envs[@]}"; do
  req="scripts/interop/$env.txt"
  con="scripts/interop/$env-constraints.txt"
  venv="$dir/$env"
  late="scripts/interop/$env.no-build-isolation.txt"
  [[ -f "$late" ]] || late=/dev/null
  want=$(cat "$req" "$late" "$con" | sha256sum | cut -d' ' -f1)
  if [[ -f "$venv/.fc-installed" && "$(cat "$venv/.fc-installed")" == "$want" ]]; then
    echo "interop environment $env: up to date ($venv)"
    continue
  fi
  echo "interop environment $env: installing $(grep -v '^#' "$req" | sed 's/ *#.*//' | tr '\n' ' ')into $venv"
  log="$dir/$env.pip.log"
  : >"$log"
  rm -f "$venv/.fc-installed" "$dir/$env.failed"
  [[ -x "$venv/bin/pip" ]] || /usr/bin/python3 -m venv "$venv"
  if pip_retry "$venv" "$log" -r "$req" -c "$con" &&
     pip_retry "$venv" "$log" --no-build-isolation -r "$late" -c "$con"; then
    echo "$want" >"$venv/.fc-installed"
    echo "interop environment $env: installed ($(du -sh "$venv" | cut -f1))"
  else
    tail -n 30 "$log" >"$dir/$env.failed"
    echo "interop environment $env: pip failed; its last lines:" >&2
    cat "$dir/$env.failed" >&2
  fi
done
((setup_only)) && exit 0

[[ -d build-test ]] || meson setup build-test -Dtests=enabled >/dev/null
ninja -C build-test
FC_INTEROP_DIR="$dir" meson test -C build-test --print-errorlogs --num-processes "$(nproc)" \
  --suite real "$@"
