"""`repro bench`: performance tables of the fuser across targets (harness.bench does the work)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from cases.matrix import generate, matrix_names
from harness import bench
from harness.bench import stats as bench_stats
from harness.errors import UsageError
from harness.runner import rundir
from harness.targets import sources
from repro import validate


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def render_table(perf: dict[str, Any]) -> str:
    """The three ratios per row: +backport / unpatched, +backport / upstream, and fuser /
    unfused reference for each target."""
    specs = [t["spec"] for t in perf["targets"]]
    devices = {r["device"] for r in perf["rows"]}
    headers = ["shape", "pipeline", "dtype", *(["device"] if devices - {"cpu"} else []), "mode"]
    headers += [f"{label}\n{' / '.join(pair) if pair else ''}" for label, pair in perf["comparisons"].items()]
    headers += [f"fuser / ref\n{spec}" for spec in specs]
    rows = []
    for row in perf["rows"]:
        cells = [row.get("shape", "tiny"), row["pipeline"], row["dtype"], *([row["device"]] if devices - {"cpu"} else []),
                 row["mode"]]
        cells += [bench_stats.format_ratio(row["ratios"].get(label)) for label in perf["comparisons"]]
        cells += [bench_stats.format_ratio(row["ratios"][bench_stats.FUSER_VS_REFERENCE].get(s)) for s in specs]
        rows.append(cells)
    return tabulate(rows, headers=headers) if rows else "(no combination completed on every target)"


def render_notes(perf: dict[str, Any]) -> str:
    lines = [f"{perf['rounds']} rounds, min_run_time {perf['min_run_time']}s; {perf['timer']}", *perf["notes"]]
    if perf.get("test_slowdown"):
        lines.append(f"TEST-ONLY SLOWDOWN ACTIVE ({bench.TEST_SLOW_ENV}): {perf['test_slowdown']}")
    if perf["excluded"]:
        lines.append(f"excluded ({len(perf['excluded'])}), not timed because not every target completes them:")
        lines += [f"  {bench_stats.row_name(e)}: {e['reason']}" for e in perf["excluded"]]
    lines += [f"problem: {p}" for p in perf["problems"]]
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    specs = validate.target_specs(args.targets, None, bench.default_targets(args.matrix)) or []
    upstream = args.upstream or bench.default_upstream(args.matrix, specs)
    validate.check_only(args.only)
    modes = bench.parse_modes(args.modes)
    shapes = bench.parse_shapes(args.shapes)
    generate(args.matrix, args.only)
    if args.fail_on_slowdown is not None and bench_stats.pairings(specs, upstream)[
            bench_stats.BACKPORT_VS_UNPATCHED] is None:
        raise UsageError("--fail-on-slowdown needs a +backport target and its unpatched base among --targets")
    out_dir = Path(args.out or Path("runs") / f"bench-{args.matrix}")
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, specs or [], cache)
    with rundir.claim(out_dir):
        rundir.remove_stale(out_dir)
        try:
            perf = bench.run_bench(args.matrix, args.only, specs, modes, args.rounds, args.min_run_time, out_dir,
                                   cache, args.offline, upstream, _progress, shapes)
        except bench.BenchWorkerError as exc:
            print(f"repro bench: error: {exc}", file=sys.stderr)
            return 1
        rundir.write_atomic(out_dir / "perf.json", json.dumps(perf, indent=1))
        print(render_table(perf))
        print()
        print(render_notes(perf))
        try:
            from harness.bench.plot import perf_svg

            rundir.write_atomic(out_dir / "perf.svg", perf_svg(perf))
            print(f"\nbench dir: {out_dir} (perf.json, perf.svg)")
        except ImportError:
            print(f"\nbench dir: {out_dir} (perf.json; perf.svg needs matplotlib)")
    if args.fail_on_slowdown is not None:
        slow = bench_stats.slowdowns(perf["rows"], args.fail_on_slowdown)
        for message in slow:
            print(f"repro bench: slowdown over {args.fail_on_slowdown}%: {message}", file=sys.stderr)
        return 1 if slow else 0
    return 0


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[common], help="time the fuser across targets, side by side, with ratios")
    # smoke by default: a bench of issue22 times 144 combinations per target and takes long.
    p.add_argument("--matrix", default="smoke", help=f"preset whose pipelines and dtypes to bench: {', '.join(matrix_names())}"
                   " (default smoke)")
    p.add_argument("--only", action="append", metavar="AXIS=V[,V]", help="keep only these axis values (only pipeline, dtype and device matter here; modes come from --modes)")
    p.add_argument("--targets", help=f"comma-separated specs (default {','.join(bench.DEFAULT_TARGETS)} for issue22 and "
                   "its presets, else the regression's own default targets)")
    p.add_argument("--upstream", help="the upstream-fixed target for "
                   f"'{bench_stats.BACKPORT_VS_UPSTREAM}' (default {bench.DEFAULT_UPSTREAM} for issue22, else the first "
                   "plain release among the targets other than the patched one's base)")
    p.add_argument("--modes", help=f"comma-separated modes (default all: {', '.join(bench.MODES)})")
    p.add_argument("--shapes", help=f"comma-separated shapes (default all: {', '.join(bench.SHAPES)}; "
                   + "; ".join(f"{n}: {s.description}" for n, s in bench.SHAPES.items()) + ")")
    p.add_argument("--rounds", type=validate.positive_int, default=5, help="rounds of A B C timing (at least 2; default 5)")
    p.add_argument("--min-run-time", type=validate.positive_float, default=0.03, help="seconds per measurement (default 0.03)")
    p.add_argument("--fail-on-slowdown", type=float, metavar="PCT",
                   help=f"exit 1 if a '{bench_stats.BACKPORT_VS_UNPATCHED}' median exceeds 1+PCT/100 (not for CI)")
    p.add_argument("--out", help="bench dir (default runs/bench-<matrix>)")
    p.set_defaults(func=cmd_bench)
