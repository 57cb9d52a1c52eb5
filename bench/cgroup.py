"""Runs commands inside a cgroup-v1 memory cap (root only): emulates a phone with less RAM than
the model. Page cache the process touches is charged to the cgroup too, so an mmap'd model
larger than the cap must be paged in and out, as on the device."""
import os
import subprocess
import time

ROOT = "/sys/fs/cgroup/memory"


def available():
    return os.path.isdir(ROOT) and os.access(ROOT, os.W_OK)


class MemoryCap:
    def __init__(self, name, limit_bytes):
        self.path = os.path.join(ROOT, name)
        self.limit = limit_bytes

    def __enter__(self):
        if not available():
            raise RuntimeError(f"cgroup-v1 memory controller not writable at {ROOT} (run as root)")
        os.makedirs(self.path, exist_ok=True)
        self._write("memory.force_empty", "0", ignore_errors=True)
        self._write("memory.limit_in_bytes", str(self.limit))
        try:
            self._write("memory.memsw.limit_in_bytes", str(self.limit), ignore_errors=True)
        except OSError:
            pass
        return self

    def __exit__(self, *exc):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)

    def _write(self, name, value, ignore_errors=False):
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError:
            if not ignore_errors:
                raise

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def max_usage(self):
        return int(self.read("memory.max_usage_in_bytes"))

    def oom_kills(self):
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def prefix(self):
        """A command prefix that moves the child into this cgroup before exec."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "--"]


def drop_page_cache():
    """Starts every run cold, so earlier runs' cached file pages do not help the next."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def run_capped(cmd, name, ram_gib, **kwargs):
    """subprocess.run(cmd) inside a cap of ram_gib GiB (none when ram_gib <= 0), from a cold
    page cache when capped; keyword arguments go to subprocess.run."""
    if ram_gib <= 0:
        return subprocess.run(cmd, **kwargs)
    drop_page_cache()
    with MemoryCap(f"{name}-{os.getpid()}", int(ram_gib * (1 << 30))) as cap:
        return subprocess.run(cap.prefix() + cmd, **kwargs)
