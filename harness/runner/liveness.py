"""Whether a slow child is working or stuck, seen from outside it: a busy machine makes a
worker slow, never dead. A worker shows progress while its CPU time grows (read from
/proc, so the child needs no heartbeat of its own); a bound on silence is scaled by how
loaded the machine is."""

from __future__ import annotations

import os
from pathlib import Path

PROGRESS_CPU_S = 0.05  # CPU seconds between two looks that count as progress
CEILING = 10  # a child still busy past this many times its bound is given up (a loop in C code)


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a live process (every thread); None where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime and stime: fields 14 and 15 of stat


def load_factor() -> float:
    """How many times over the machine is booked: the 1-minute load average per CPU, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def load_text() -> str:
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "unknown"
    return f"load average {load} on {os.cpu_count() or 1} CPUs"


def overran(pid: int, started: float, now: float, bound_s: float,
            seen: dict[tuple[int, float], tuple[float, float, float]]) -> bool:
    """Whether a child loading since `started` is past its bound: it used `bound_s` of CPU in
    this load (a loop), or none for `bound_s` scaled by the load (a hang), or ran CEILING times
    that. `seen` keeps, per (pid, start), the CPU time at the first look, the CPU time last
    seen and when it last grew. Where /proc cannot tell, wall time against `bound_s`."""
    cpu = cpu_seconds(pid)
    if cpu is None:
        return now - started > bound_s
    first, last, grew = seen.get((pid, started), (cpu, cpu, started))
    if cpu - last >= PROGRESS_CPU_S:
        last, grew = cpu, now
    seen[(pid, started)] = (first, last, grew)
    scaled = bound_s * load_factor()
    return cpu - first > bound_s or now - grew > scaled or now - started > CEILING * scaled
