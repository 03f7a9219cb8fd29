"""torchrun for the real-framework fixture makers and tests, repeated when a worker dies by a
signal.

A worker killed by a signal is the framework's crash, not a result. It has been seen in CI
on 2 cores with gloo and torch 2.15 ("terminate called without an active exception", SIGABRT
in rank 1): once during DeepSpeed's start-up, once in torch's FSDP2 fixture run. The run is
repeated, at most twice, saying so on stderr, with the clean_dirs emptied first. An ordinary
Python error (a failed assertion included) is a result and is returned at once.

Imported by path: sys.path gets testdata/real, then `import torchrun`.
"""

import os
import re
import shutil
import subprocess
import sys

ATTEMPTS = 3


def died_by_signal(stderr):
    """torch.distributed.run reports a worker killed by signal N as "exitcode: -N"."""
    return re.search(r"exitcode: -\d+", stderr) is not None


def run(nproc, port, args, env=None, clean_dirs=(), echo=False):
    """Runs `python -m torch.distributed.run --nproc-per-node nproc --master-port port *args`.

    Returns the last CompletedProcess (stdout and stderr captured as text). With echo, the
    captured output of the returned run is written to this process's stdout and stderr, for
    callers that used to let it through."""
    for attempt in range(ATTEMPTS):
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            str(nproc), "--master-port", str(port), *args], env=env,
                           capture_output=True, text=True)
        if p.returncode == 0 or not died_by_signal(p.stderr) or attempt == ATTEMPTS - 1:
            break
        sys.stderr.write(f"{' '.join(args)}: a worker died by a signal; running it again\n"
                         + p.stderr[-2000:] + "\n")
        for d in clean_dirs:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
    if echo:
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    return p


def check_run(nproc, port, args, env=None, clean_dirs=()):
    """run() with the output let through; raises CalledProcessError when the run failed."""
    p = run(nproc, port, args, env, clean_dirs, echo=True)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, p.args)
    return p
