"""Runs bmoe-cli with no mode flag on a model, under a cgroup-v1 memory cap (GiB, 0 = none),
and prints the mode line, the run's stats lines, the wall time, the peak RSS and the cgroup's
max usage. Usage: run_mode.py MODEL CAP_GIB [N_TOKENS]"""
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, "/work/main/bench")
from cgroup import MemoryCap, drop_page_cache  # noqa: E402

CLI = "/work/main/build/tools/bmoe-cli"


def main():
    model, cap_gib = sys.argv[1], float(sys.argv[2])
    n = sys.argv[3] if len(sys.argv) > 3 else "16"
    cmd = [CLI, "-m", model, "-p", "The history of the river valley", "-n", n]
    print("loadavg before:", open("/proc/loadavg").read().strip())
    print("cmd:", " ".join(cmd), f"(cap {cap_gib} GiB)" if cap_gib > 0 else "(no cap)")
    drop_page_cache()
    t0 = time.time()
    if cap_gib > 0:
        with MemoryCap(f"proof33-{os.getpid()}", int(cap_gib * (1 << 30))) as cap:
            p = subprocess.run(cap.prefix() + cmd, capture_output=True, text=True)
            print("cgroup max_usage MiB:", cap.max_usage() >> 20, "oom_kills:", cap.oom_kills())
    else:
        p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10
    print("rc:", p.returncode, f"wall {wall:.1f} s", "peak RSS MiB:", rss)
    print("loadavg after:", open("/proc/loadavg").read().strip())
    print("--- stdout ---\n" + p.stdout[-2000:])
    print("--- stderr ---\n" + p.stderr[-6000:])


if __name__ == "__main__":
    main()
