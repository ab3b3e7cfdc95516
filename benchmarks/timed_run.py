"""One `repro run` from a checkout, timed end to end: shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def timed_repro_run(checkout: Path, out: Path, args: list[str]) -> tuple[float, int, dict[str, Any], float]:
    """`python -m repro run ARGS --out OUT` in `checkout`: wall seconds, exit status, run.json, and the
    CPU seconds (user + system) of the run and every process it started."""
    command = [sys.executable, "-m", "repro", "run", *args, "--out", str(out)]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(checkout)}  # this checkout's code, whatever is installed
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if not (out / "run.json").is_file():
        raise SystemExit(f"{checkout}: repro run wrote no run.json (exit {result.returncode}): "
                         f"{result.stderr.strip()[-500:]}")
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # each process of the run is reaped by its parent
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return wall, result.returncode, json.loads((out / "run.json").read_text()), cpu
