"""Runs one command and measures it, for bench/peers.sh.

usage: python3 bench/peers/measure.py RESULT.json -- CMD [ARG...]

Writes RESULT.json with
  wall_s        seconds from the fork to the command's exit (reaped by wait4)
  wall_sync_s   the same plus a sync(2) right after it: the output is on disk (fc syncs its
                own output; the peers do not, so this is the time compared)
  maxrss_kib    ru_maxrss of wait4: the largest resident set of any one process of the tree
                (the kernel keeps the max over the process and the children it reaped)
  tree_rss_kib  the largest sum of VmRSS over the whole process tree, sampled every 20 ms
                (multi-process peers: workers run at once; shared pages count once per
                process, so this can overstate; a peak shorter than 20 ms can be missed)
  rchar         bytes the tree's read()/pread()/readv() calls returned (/proc/PID/io
                rchar), page-cache hits included, mmap()ed reads NOT included
  read_bytes    bytes the tree caused to be fetched from the block device (/proc/PID/io
                read_bytes): with a cold page cache, what really came off the disk, mmap
                faults included; with a warm cache about 0
  wchar, write_bytes  the same for writes
  exit          the command's exit status (negative: killed by that signal)
The counters are the wrapper's own /proc/self/io before and after: Linux adds a reaped
child's counters (its own and those of the children it reaped) to its parent's when the
parent waits for it, so the difference is the whole tree's, less what the wrapper's own
sampling read from /proc (counted and subtracted). A grandchild that is never reaped by its
parent (a daemon) would be missed; torchrun, multiprocessing pools and the fc tools reap
theirs.
"""
import json
import os
import sys
import threading
import time


def self_io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def main():
    out = sys.argv[1]
    assert sys.argv[2] == "--"
    cmd = sys.argv[3:]
    before = self_io()
    proc_read = [len(open("/proc/self/io").read())]  # the second self_io() read, counted
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    peak = [0]
    done = threading.Event()

    def read_proc(path):
        try:
            with open(path) as f:
                s = f.read()
        except OSError:
            return ""
        proc_read[0] += len(s)
        return s

    def tree(root):
        pids, todo = [], [root]
        while todo:
            p = todo.pop()
            pids.append(p)
            for tid in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
                todo += [int(c) for c in read_proc(f"/proc/{p}/task/{tid}/children").split()]
        return pids

    def sample():
        while not done.wait(0.02):
            total = 0
            try:
                for p in tree(pid):
                    for line in read_proc(f"/proc/{p}/status").splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except (OSError, ValueError):
                continue
            peak[0] = max(peak[0], total)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, ru = os.wait4(pid, 0)
    t1 = time.monotonic()
    done.set()
    th.join()
    os.sync()
    t2 = time.monotonic()
    after = self_io()
    code = os.waitstatus_to_exitcode(status)
    res = {"cmd": cmd, "exit": code, "wall_s": t1 - t0, "wall_sync_s": t2 - t0,
           "maxrss_kib": ru.ru_maxrss, "tree_rss_kib": max(peak[0], ru.ru_maxrss),
           "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
           "rchar": after["rchar"] - before["rchar"] - proc_read[0],
           "read_bytes": after["read_bytes"] - before["read_bytes"],
           "wchar": after["wchar"] - before["wchar"],
           "write_bytes": after["write_bytes"] - before["write_bytes"]}
    with open(out, "w") as f:
        json.dump(res, f)
    sys.exit(0 if code == 0 else 1)


if __name__ == "__main__":
    main()
