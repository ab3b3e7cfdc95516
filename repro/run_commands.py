"""`repro run` and `repro list`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from tabulate import tabulate

from cases.axes import AXES
from cases.matrix import MAX_CASES_DEFAULT, PRESETS, generate, skip_reason
from harness import targets
from harness.runner import rundir
from harness.runner.completeness import incomplete_reason
from harness.runner.sessions import CASE_TIMEOUT_S, Interrupted, run_matrix
from harness.targets import sources
from repro import validate
from repro.reports import write_all_formats
from repro.summary import exit_status, render_terminal


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    # Every option is checked before anything is written (the cache included).
    specs = validate.target_specs(args.targets, args.target, targets.DEFAULT_TARGETS)
    validate.check_fork_config(args.fork_config, specs)
    validate.check_only(args.only)
    generate(args.matrix, args.only, args.max_cases)
    out_dir = Path(args.out or Path("runs") / args.matrix)
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, specs, cache)
    with rundir.claim(out_dir):
        try:
            run = run_matrix(args.matrix, args.only, specs, out_dir, args.workers, cache, args.offline,
                             args.max_cases, progress=_progress, case_timeout=args.case_timeout,
                             fork_config=args.fork_config)
        except (Interrupted, KeyboardInterrupt):
            print(f"repro: interrupted; partial results kept in {out_dir / 'results.jsonl'}; "
                  f"render them with: repro report {out_dir} --format md", file=sys.stderr)
            return 130
        if args.perf:
            from harness.bench import parse_modes, run_bench

            run["perf"] = run_bench(args.matrix, args.only, specs, parse_modes(None), rounds=3, min_run_time=0.05,
                                    out_dir=out_dir, cache=cache, offline=args.offline, progress=_progress)
        rundir.write_atomic(out_dir / "run.json", json.dumps(run, indent=1))
        write_all_formats(run, out_dir)
    print(render_terminal(run))
    print(f"\nrun dir: {out_dir}")
    status = exit_status(run)
    if reason := incomplete_reason(run):
        print(f"repro: {reason}", file=sys.stderr)
        status = max(status, 1)
    return status


def cmd_sweep(args: argparse.Namespace) -> int:
    from harness.runner.sweep import sweep

    validate.check_only(args.only)
    generate(args.matrix, args.only, args.max_cases)
    out_dir = Path(args.out or Path("runs") / f"sweep-{args.matrix}")
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, [], cache)
    with rundir.claim(out_dir):
        result = sweep(args.matrix, args.only, args.from_version, args.to_version, out_dir, args.workers,
                       cache, args.offline, _progress)
        rundir.write_atomic(out_dir / "run.json", json.dumps(result["run"], indent=1))
    rows = [[r["release"], f"{r['affected_failing']}/{r['affected']}", r["other_failures"], r["verdict"], r["reason"]]
            for r in result["rows"]]
    print(tabulate(rows, headers=["release", "affected failing", "other failures", "verdict", "reason"]))
    first = result["first_fixed"]
    print(f"\nfirst release in which every affected case passes: {first}" if first else
          "\nno release in the range fixes every affected case after an affected one")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from harness.targets.devices import unavailable_reasons

    rows = [[device, "available" if reason is None else "unavailable", reason or ""]
            for device, reason in unavailable_reasons().items()]
    print(tabulate(rows, headers=["device", "status", "reason"]))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    validate.check_only(args.only)
    cases = generate(args.matrix, args.only, args.max_cases)
    feasible = [c for c in cases if skip_reason(c) is None]
    rows = []
    for axis in AXES:
        counts = Counter(getattr(c, axis) for c in cases)
        runnable = Counter(getattr(c, axis) for c in feasible)
        rows += [[axis, value, counts[value], runnable[value]] for value in AXES[axis] if counts[value]]
    print(tabulate(rows, headers=["axis", "value", "cases", "runnable"]))
    print(f"\n{len(cases)} cases per target, {len(feasible)} runnable, {len(cases) - len(feasible)} skipped with a reason")
    return 0


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("--matrix", default="issue22", help=f"preset: {', '.join(PRESETS)}")
    selection.add_argument("--only", action="append", metavar="AXIS=V[,V]", help="keep only these axis values")
    selection.add_argument("--max-cases", type=validate.positive_int, default=MAX_CASES_DEFAULT,
                           help="refuse larger selections")

    p = sub.add_parser("run", parents=[common, selection], help="run a case matrix over targets")
    p.add_argument("--targets", metavar="A,B,...",
                   help=f"comma-separated specs (default {','.join(targets.DEFAULT_TARGETS)}); a spec is "
                   f"{targets.SPEC_FORMS}; +name is a patch only when patches/name.toml exists")
    p.add_argument("--target", action="append", metavar="SPEC",
                   help="one more target, never split at commas (for a path holding a comma); repeatable")
    p.add_argument("--fork-config", metavar="FILE",
                   help="a fork's TOML config for the path: and installed targets (default: <tree>/.te-repro.toml)")
    p.add_argument("--out", help="run dir (default runs/<matrix>); one run at a time; never inside a source or "
                   "the cache")
    p.add_argument("-n", "--workers", type=validate.positive_int, default=min(2, os.cpu_count() or 1),
                   help="xdist workers per target (1 or more)")
    p.add_argument("--perf", action="store_true", help="also benchmark the matrix (as repro bench) into the reports")
    p.add_argument("--case-timeout", type=validate.positive_float, default=CASE_TIMEOUT_S,
                   help="seconds (above 0) before a case is recorded as hung")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("list", parents=[selection], help="count cases per axis value without running")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("sweep", parents=[common, selection], help="run the matrix over every release in a range")
    p.add_argument("--from", dest="from_version", default="2.8.0", help="oldest release (default 2.8.0)")
    p.add_argument("--to", dest="to_version", default="latest", help="newest release, or latest")
    p.add_argument("--out", help="run dir (default runs/sweep-<matrix>)")
    p.add_argument("-n", "--workers", type=validate.positive_int, default=min(2, os.cpu_count() or 1),
                   help="parallel sessions (1 or more)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("devices", help="list devices with their status or the reason they are unavailable")
    p.set_defaults(func=cmd_devices)
