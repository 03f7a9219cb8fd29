"""venv_run.py's refusals: an interop environment that is not installed fails under CI=true
(exit 1, pip's error from <env>.failed printed) and skips elsewhere (exit 77, naming the
command that installs it); an installed one runs the script with its python.

usage: venv_run_test.py VENV_RUN
"""
import os
import subprocess
import sys
import tempfile

VENV_RUN = sys.argv[1]


def run(root, ci):
    env = dict(os.environ, FC_INTEROP_DIR=root)
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, VENV_RUN, "demo", "-c", "print('ran')"],
                          capture_output=True, text=True, env=env)


with tempfile.TemporaryDirectory() as root:
    p = run(root, ci=False)
    assert p.returncode == 77, (p.returncode, p.stdout)
    assert "SKIP: the interop environment 'demo' is not installed" in p.stdout, p.stdout
    assert "scripts/interop.sh --setup-only" in p.stdout, p.stdout
    with open(os.path.join(root, "demo.failed"), "w") as f:
        f.write("ERROR: No matching distribution found for demo==1.0\n")
    p = run(root, ci=True)
    assert p.returncode == 1, (p.returncode, p.stdout)
    assert "FAIL: the interop environment 'demo' is not installed" in p.stdout, p.stdout
    assert "No matching distribution found for demo==1.0" in p.stdout, p.stdout
    # Installed: a venv whose python is this one (a symlink), with the marker.
    os.makedirs(os.path.join(root, "demo", "bin"))
    os.symlink(sys.executable, os.path.join(root, "demo", "bin", "python"))
    open(os.path.join(root, "demo", ".fc-installed"), "w").close()
    p = run(root, ci=True)
    assert p.returncode == 0 and p.stdout.strip() == "ran", (p.returncode, p.stdout, p.stderr)
print("ok")
