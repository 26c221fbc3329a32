"""CPU time, read from /proc: what a run cost, and what else was running.

Wall-clock throughput on a shared 2-core machine moves with whatever else runs; the CPU
seconds a system spends per request move much less. So every run also records the CPU
its own processes (and the client, this process) spent per request, and the whole run
records how busy the machine was with processes that are not ours.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _tree(pid: int) -> list[int]:
    """pid and its live descendants (prefork pool children, for one)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):  # exited while we looked
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


def tree_seconds(pid: int) -> float:
    """CPU seconds of pid and its live descendants."""
    return sum(_seconds(p) for p in _tree(pid))


def _seconds(pid: int) -> float:
    """CPU seconds of pid, plus its children that have exited and been waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # gone; its time is already in its parent's counters
    return sum(int(x) for x in fields[11:15]) / _HZ  # utime stime cutime cstime


class ProcessCpu:
    """CPU seconds spent by some process trees and by this (client) process."""

    def __init__(self, roots: Callable[[], Iterable[int]]) -> None:
        self._roots = roots

    def read(self) -> float:
        server = sum(tree_seconds(root) for root in self._roots())
        return server + _own_seconds()


class MachineCpu:
    """How much of the machine's CPU went to processes other than this run's.

    This process and every child it waited for (workers, their pool children, Redis)
    are counted by `os.times()`; everything else busy in /proc/stat is somebody else's.
    """

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / _HZ  # all but idle and iowait
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()

    def busy_share(self) -> float:
        """The share of the machine's CPUs that was busy since start, whoever used it."""
        busy, _, now = self._read()
        return round((busy - self.start[0]) / ((now - self.start[2]) * (os.cpu_count() or 1)), 3)

    def others_share(self) -> float:
        busy, own, now = self._read()
        total = (now - self.start[2]) * (os.cpu_count() or 1)
        others = (busy - self.start[0]) - (own - self.start[1])
        return round(max(0.0, others / total), 3)


def by_process(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process tree, and of this process as `client`."""
    out = {name: tree_seconds(pid) for name, pid in pids.items()}
    out["client"] = _own_seconds()
    return out


def projected_ceiling(ms_per_request: dict[str, float], cores: int, single: Iterable[str]) -> tuple[float, str]:
    """Requests/s a machine of `cores` cores could serve at these CPU milliseconds per
    request, by process, and what binds it. A process named in `single` stays one
    process however large the machine (the collector, Redis: at most one core each);
    the others scale out with the machine (callers, device workers, pool processes), so
    together all of them can use every core."""
    bounds = {name: 1000.0 / ms_per_request[name] for name in single if ms_per_request.get(name, 0) > 0}
    total = sum(ms_per_request.values())
    if total > 0:
        bounds[f"all {cores} cores"] = cores * 1000.0 / total
    if not bounds:
        return float("inf"), "nothing"
    name = min(bounds, key=lambda k: bounds[k])
    return bounds[name], name
