#!/usr/bin/env python3
"""Fails when a meson test run skipped a test outside the gpu suite (issue 34: under CI
nothing may skip but the GPU tests on a machine without a device).

usage: check-skips.py BUILD_DIR   (reads BUILD_DIR/meson-logs/testlog.json, the last run)

Prints every skipped test with the reason it printed, and exits 1 if any is outside the gpu
suite; exit 0 otherwise (the gpu skips are listed, not counted).
"""
import json
import os
import sys


def main():
    log = os.path.join(sys.argv[1], "meson-logs", "testlog.json")
    bad, allowed = [], []
    with open(log) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            if t.get("result") != "SKIP":
                continue
            # "fc:gpu / name" or "fc:interop+tools / name": the suites before " / ".
            suites = t["name"].split(" / ")[0].split(":", 1)[-1].split("+")
            out = (t.get("stdout") or "").strip().splitlines()
            why = out[-1] if out else "(no reason printed)"
            (allowed if "gpu" in suites else bad).append(f"  {t['name']}: {why}")
    if allowed:
        print("skipped (gpu suite, no device):\n" + "\n".join(allowed))
    if bad:
        print("error: tests skipped outside the gpu suite (under CI every other test must run):\n"
              + "\n".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
