"""What loading the whole TE package costs: this checkout against an older one, side by side.

Runs `repro run --matrix M` from both checkouts in alternating rounds (old, new, new, old, ...)
in one invocation, so both see the same machine, and prints:

1. the wall time of each run, the median per side, and the ratio new / old;
2. the import cost per process, as the runs' own workers measured it
   (sessions/*.startup.jsonl): torch, the target, Megatron (where a worker imported it);
3. the sum of the per-case durations each side recorded (the compute, without start-up).

    git archive 33f8715 | tar -x -C /tmp/old-checkout
    python benchmarks/loader_cost.py --old /tmp/old-checkout [--matrix issue22] [--rounds 1] [-n 2]

Each checkout runs with itself first on PYTHONPATH. Ratios with the load average; never a
pass or fail on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def timed_run(checkout: Path, matrix: str, workers: int, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "repro", "run", "--matrix", matrix, "-n", str(workers), "--out", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if not (out / "run.json").is_file():
        raise SystemExit(f"{checkout}: repro run wrote no run.json (exit {result.returncode}): {result.stderr[-500:]}")
    run = json.loads((out / "run.json").read_text())
    startups = []
    for path in sorted((out / "sessions").glob("*.startup.jsonl")):
        lines = path.read_text().splitlines()
        if lines:
            startups.append({"session": path.name.removesuffix(".startup.jsonl"), **json.loads(lines[-1])})
    return {"wall_s": wall, "exit": result.returncode, "cases": len(run["results"]),
            "compute_s": sum(r["duration_s"] for r in run["results"]),
            "verdicts": {f"{r['target']}|{r['case_id']}": r["verdict"] for r in run["results"]}, "startups": startups}


def _per_process(runs: list[dict[str, Any]], key: str) -> str:
    values = [s[key] for run in runs for s in run["startups"] if s.get(key) is not None]
    return f"{statistics.median(values):.2f} s (median of {len(values)})" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, type=Path, help="a checkout of the older code")
    parser.add_argument("--matrix", default="issue22")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    sides: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="loader-cost-") as tmp:
        for round_ in range(args.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for side in order:
                checkout = args.old.resolve() if side == "old" else REPO
                out = Path(tmp) / f"{side}-{round_}"
                sides[side].append(timed_run(checkout, args.matrix, args.workers, out))
                print(f"round {round_ + 1} {side}: {sides[side][-1]['wall_s']:.1f} s", flush=True)
    walls = {side: statistics.median(r["wall_s"] for r in runs) for side, runs in sides.items()}
    same = all(r["verdicts"] == sides["old"][0]["verdicts"] for r in sides["new"])
    print(f"\nmatrix {args.matrix}, -n {args.workers}, {args.rounds} round(s), load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for side, runs in sides.items():
        print(f"{side}: wall {walls[side]:.1f} s; compute {statistics.median(r['compute_s'] for r in runs):.1f} s; "
              f"per process: torch {_per_process(runs, 'torch_import_s')}, target "
              f"{_per_process(runs, 'target_load_s')}, megatron {_per_process(runs, 'megatron_import_s')}")
    print(f"wall new / old: {walls['new'] / walls['old']:.3f}; verdicts per case identical: {same}")
    if args.json:
        args.json.write_text(json.dumps({side: [{k: v for k, v in r.items() if k != "verdicts"} for r in runs]
                                         for side, runs in sides.items()}, indent=1))


if __name__ == "__main__":
    main()
