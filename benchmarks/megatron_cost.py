"""What do the Megatron clients cost? Prints, for one target:

1. per process: the worker's wall time, the TE target's load and Megatron's import
   (megatron-core from the cache, after the target);
2. per case: build (client modules and weights) and run (forward, backward, reference and
   comparison) of each client scenario, median over `--repeat` runs in the same process;
3. for comparison, the same target's TE load without Megatron (`harness.targets.probe`).

    python benchmarks/megatron_cost.py [--target te-2.16.0] [--megatron 0.19.0] [--repeat 5]

The figures depend on the machine and on what else runs on it: the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import targets
from harness.megatron.source import DEFAULT_VERSION, prepare_megatron
from harness.megatron.worker import run_in_subprocess
from harness.targets.sources import cache_dir

SCENARIOS = [("megatron_norm", "none"), ("megatron_norm", "megatron_checkpoint"),
             ("megatron_block", "none"), ("megatron_block", "full_block"), ("megatron_block", "full_uniform")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="te-2.16.0")
    parser.add_argument("--megatron", default=DEFAULT_VERSION)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cache = cache_dir()
    prepared = targets.prepare(args.target, cache)
    megatron = prepare_megatron(args.megatron, cache)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.target}, megatron-core {megatron.version}")

    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness.targets.probe", prepared.to_json()], capture_output=True, check=True)
    print(f"process without Megatron (torch + TE target load): {time.perf_counter() - started:.2f} s wall")

    started = time.perf_counter()
    report = run_in_subprocess(prepared, megatron, SCENARIOS * args.repeat)
    wall = time.perf_counter() - started
    if report["load_error"]:
        raise SystemExit(report["load_error"])
    print(f"process with Megatron: {wall:.2f} s wall for {len(SCENARIOS) * args.repeat} cases; "
          f"TE load {report['te_load_s']:.2f} s, Megatron import {report['megatron_import_s']:.2f} s")
    print(f"{'client':<16}{'recompute':<22}{'build ms':>10}{'run ms':>10}{'outcome':>12}")
    for client, recompute in SCENARIOS:
        results = [r for r in report["results"] if (r["client"], r["recompute"]) == (client, recompute)]
        build = statistics.median(r["build_s"] for r in results) * 1000
        run = statistics.median(r["run_s"] for r in results) * 1000
        outcome = "matched" if results[0]["completed"] and results[0]["matched"] else (
            "crash" if not results[0]["completed"] else "MISMATCH")
        print(f"{client:<16}{recompute:<22}{build:>10.1f}{run:>10.1f}{outcome:>12}")


if __name__ == "__main__":
    main()
