"""What does the client axis cost? Two figures, measured side by side in one invocation:

1. the ops cases, before and after: `repro run --matrix issue22 --only client=ops` from another
   checkout (`--before DIR`, e.g. a `git worktree` of the commit before the client axis) and from
   this one, in alternating rounds (before, after, before, after, ...), wall time of each;
2. the Megatron cases: `repro run --matrix issue22 --only client=megatron_norm,megatron_block` on
   one target, wall time, and per case the engine's own `duration_s` (build, run, reference, checks)
   by client. Megatron's import per process is printed by benchmarks/megatron_cost.py.

    python benchmarks/client_cost.py --before ../before-checkout [--rounds 2] [--target te-2.16.0]

The machine may be shared: the load average is printed with every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from timed_run import timed_repro_run

HERE = Path(__file__).resolve().parent.parent


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def repro_run(checkout: Path, only: list[str], extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="client-cost-") as tmp:
        args = ["--matrix", "issue22", *(a for o in only for a in ("--only", o)), *extra]
        wall, exit_status, run, _cpu = timed_repro_run(checkout, Path(tmp) / "run", args)
        run["exit"] = exit_status
        return wall, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout without the client axis")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", default="te-2.16.0", help="the target of the Megatron-case run")
    args = parser.parse_args()

    walls: dict[str, list[float]] = {"before": [], "after": []}
    engine: dict[str, list[float]] = {"before": [], "after": []}  # the cases' own duration_s, summed
    for round_ in range(args.rounds):
        for label, checkout in (("before", args.before.resolve()), ("after", HERE)):
            before_load = load()
            wall, run = repro_run(checkout, ["client=ops"], [])
            walls[label].append(wall)
            engine[label].append(sum(r["duration_s"] for r in run["results"]))
            print(f"round {round_ + 1} {label:6s}: {len(run['results'])} results, exit {run['exit']}, "
                  f"wall {wall:.1f} s, cases' own time {engine[label][-1]:.1f} s "
                  f"({before_load} at start, {load()} at end)", flush=True)
    for what, figures in (("wall", walls), ("cases' own time", engine)):
        b, a = statistics.median(figures["before"]), statistics.median(figures["after"])
        print(f"ops cases, median {what}: before {b:.1f} s, after {a:.1f} s, after/before {a / b:.3f}")

    before_load = load()
    wall, run = repro_run(HERE, ["client=megatron_norm,megatron_block"], ["--targets", args.target])
    print(f"Megatron cases on {args.target}: {len(run['results'])} results, exit {run['exit']}, wall {wall:.1f} s "
          f"({before_load} at start, {load()} at end)")
    for client in ("megatron_norm", "megatron_block"):
        durations = [r["duration_s"] for r in run["results"] if r["client"] == client]
        if durations:
            print(f"  {client}: {len(durations)} cases, per case median {statistics.median(durations) * 1000:.0f} ms, "
                  f"mean {statistics.mean(durations) * 1000:.0f} ms, max {max(durations) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
