"""Runs a test script with the python of an interop environment (scripts/interop.sh).

usage: venv_run.py ENV SCRIPT [ARGS...]

The environment is $FC_INTEROP_DIR/ENV (default ~/.cache/fc-interop/ENV), usable once
scripts/interop.sh has installed it (ENV/.fc-installed). When it is not:
  - under CI=true the test fails, printing pip's error when the install failed;
  - elsewhere it is skipped (exit 77), naming the command that installs it.
"""
import os
import sys

SKIP = 77


def main():
    env, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    root = os.environ.get("FC_INTEROP_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "fc-interop")
    venv = os.path.join(root, env)
    python = os.path.join(venv, "bin", "python")
    if os.path.isfile(os.path.join(venv, ".fc-installed")) and os.access(python, os.X_OK):
        os.execv(python, [python, script] + args)
    failed = os.path.join(root, env + ".failed")
    why = f"the interop environment '{env}' is not installed in {venv}"
    if os.path.isfile(failed):
        with open(failed, errors="replace") as f:
            why += f"; its install failed:\n{f.read()}"
    if os.environ.get("CI") == "true":
        print(f"FAIL: {why}\n(CI runs scripts/interop.sh before this suite)", flush=True)
        sys.exit(1)
    print(f"SKIP: {why}\ninstall it with: scripts/interop.sh --setup-only", flush=True)
    sys.exit(SKIP)


if __name__ == "__main__":
    main()
