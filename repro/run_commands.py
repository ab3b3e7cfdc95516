"""`repro run` and `repro list`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from tabulate import tabulate

from cases.clients import needs_megatron
from cases.matrix import MAX_CASES_DEFAULT, generate, matrix_names, selections_of
from cases.regressions import REGRESSIONS
from harness import targets
from harness.errors import UsageError
from harness.megatron.source import (
    DEFAULT_VERSION,
    MEGATRON_ENV,
    PreparedMegatron,
    check_megatron_spec,
    prepare_megatron,
)
from harness.model import json_schema
from harness.runner import hosts, rundir, sandbox
from harness.runner.completeness import incomplete_reason
from harness.runner.expectations import all_unmet
from harness.runner.sessions import CASE_TIMEOUT_S, LOAD_TIMEOUT_S, Interrupted, run_matrix
from harness.runner.textsafe import printable
from harness.targets import sources
from harness.targets.refusal import REFUSE_ENV
from repro import rerun, validate
from repro.formats import check_step_summary, write_all_formats
from repro.progress import Progress, print_status_line
from repro.reports import load_run, run_warnings, summarize


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def rerun_selection(args: argparse.Namespace) -> list[rerun.Selection] | None:
    """The results --from-run/--verdict/--last-failed/--case ask for; None when none of them is given."""
    if (args.verdict or args.last_failed) and not args.from_run:
        raise UsageError("--verdict and --last-failed need --from-run DIR (the run to pick results from)")
    if args.verdict and args.last_failed:
        raise UsageError("give --verdict or --last-failed, not both")
    case_ids = rerun.parse_case_ids(args.case or [])
    if args.from_run:
        run = load_run(Path(args.from_run))
        verdicts = rerun.parse_verdicts(args.verdict) if args.verdict else rerun.LAST_FAILED
        return rerun.select_from_run(run, verdicts, case_ids)
    return rerun.select_cases(case_ids) if case_ids else None


def megatron_for_run(spec: str | None, selections: list, out_dir: Path, cache: Path,
                     offline: bool) -> PreparedMegatron | None:
    """The Megatron source the run's Megatron cases import (fetched now, so a bad --megatron is
    refused before anything is written); None when no selected case imports Megatron."""
    if spec is not None:
        check_megatron_spec(spec)
    needed = any(needs_megatron(case) for selection in selections for case in selection.cases)
    given_path = spec is not None and spec.startswith("path:")
    if not (needed or given_path):  # a release is fetched only when a case imports it
        return None
    prepared = prepare_megatron(spec or DEFAULT_VERSION, cache, offline)  # a path: is checked either way
    if not needed:
        return None
    if given_path:
        rundir.check_out_location(out_dir, [Path(prepared.root)], cache)
    return prepared


@contextlib.contextmanager
def megatron_env(megatron: PreparedMegatron | None) -> Iterator[None]:
    """Hand the Megatron source to the run's worker processes ($TE_REPRO_MEGATRON), for this run only."""
    if megatron is None:
        yield
        return
    before = os.environ.get(MEGATRON_ENV)
    os.environ[MEGATRON_ENV] = megatron.to_json()
    try:
        yield
    finally:
        if before is None:
            del os.environ[MEGATRON_ENV]
        else:
            os.environ[MEGATRON_ENV] = before


def cmd_run(args: argparse.Namespace) -> int:
    # Every option is checked before anything is written (the cache included).
    # None: each regression's own default targets
    specs = validate.target_specs(args.targets, args.target, None, args.fork_config)
    validate.check_only(args.only)
    tx, rsyncdirs = hosts.check_tx(args.tx), hosts.check_rsyncdirs(args.rsyncdir)
    matrix, selections, pairs = args.matrix, None, None
    if (picked := rerun_selection(args)) is not None:
        if not picked:
            print("repro: nothing to re-run: no result matches", file=sys.stderr)
            return 0
        if args.only:
            raise UsageError("--only narrows a matrix; a re-run names its cases (--from-run, --case): drop --only")
        matrix, selections = "rerun", selections_of([p.case_id for p in picked])
        planned = selections
        pairs = {(p.target, p.case_id) for p in picked}
        if specs is None and all(p.target for p in picked):  # the stored results' own targets
            specs = list(dict.fromkeys(p.target for p in picked if p.target))
    else:
        planned = generate(args.matrix, args.only, args.max_cases)
    # Absolute: the sessions get it as arguments (a relative `-rdash` would read as an option there).
    out_dir = Path(os.path.abspath(args.out or Path("runs") / matrix))
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, specs or [], cache)
    rundir.check_run_dir(out_dir)
    check_step_summary(out_dir)
    megatron = megatron_for_run(args.megatron, planned, out_dir, cache, args.offline)
    if getattr(args, "refuse_device_calls", False):  # the sessions' workers inherit it
        os.environ[REFUSE_ENV] = "1"
    with rundir.claim(out_dir), megatron_env(megatron):
        progress = Progress()  # each target's line appears once the runner has planned it
        started = time.time()
        try:
            run = run_matrix(matrix, args.only, specs, out_dir, args.workers, cache, args.offline,
                             args.max_cases, progress=progress, case_timeout=args.case_timeout,
                             load_timeout=args.load_timeout, max_rss=args.max_rss,
                             fork_config=args.fork_config, selections=selections or planned, pairs=pairs,
                             tx=tx, rsyncdirs=rsyncdirs)
        except (Interrupted, KeyboardInterrupt):
            progress.close()
            print(f"repro: interrupted; partial results kept in {out_dir / 'results.jsonl'}; "
                  f"render them with: repro report {out_dir} --format md", file=sys.stderr)
            return 130
        progress.close()
        if args.perf:
            from harness.bench import parse_modes, run_bench

            bench_specs = specs or list(REGRESSIONS["issue22"].default_targets)
            run["perf"] = run_bench(args.matrix, args.only, bench_specs, parse_modes(None), rounds=3,
                                    min_run_time=0.05, out_dir=out_dir, cache=cache, offline=args.offline,
                                    progress=_progress)
        if megatron is not None:
            run["environment"]["megatron"] = {"spec": megatron.spec, "version": megatron.version,
                                              "source": megatron.source}
        # The model stores both as None; set them (setdefault would keep the None).
        run["started_at"] = run.get("started_at") or datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
        run["elapsed_s"] = round(time.time() - started, 1)
        run["summary"] = summarize(run)
        text = rundir.run_text(run)
        rundir.write_atomic(out_dir / "run.json", text)
        shown = printable(run, text)
        paths = write_all_formats(run, out_dir, shown)
    print_status_line(shown, paths)
    for line in [*run_warnings(run), *all_unmet(run)]:
        print(f"repro: {printable(line)}", file=sys.stderr)
    if reason := incomplete_reason(run):
        print(f"repro: {reason}", file=sys.stderr)
    return 0 if run["summary"]["status"] == "PASS" else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from harness.runner.sweep import sweep

    if args.matrix not in REGRESSIONS:
        raise UsageError(f"sweep takes one regression; valid: {', '.join(REGRESSIONS)}")
    validate.check_only(args.only)
    generate(args.matrix, args.only, args.max_cases, preset="sweep")
    out_dir = Path(os.path.abspath(args.out or Path("runs") / f"sweep-{args.matrix}"))
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, [], cache)
    check_step_summary(out_dir)
    with rundir.claim(out_dir):
        result = sweep(args.matrix, args.only, args.from_version, args.to_version, out_dir, args.workers,
                       cache, args.offline, _progress)
        rundir.write_atomic(out_dir / "run.json", rundir.run_text(result["run"]))
    columns = ("release", "affected", "reproduced", "failed_otherwise", "passed", "unaffected_failing",
               "not_applicable", "state", "reason")
    print(tabulate([[row[c] for c in columns] for row in result["rows"]], headers=list(columns)))
    regression = REGRESSIONS[args.matrix]
    print(f"\n{regression.id}: first affected release: {result['first_affected'] or 'none in the range'}"
          f" (declared: {regression.first_affected or 'before 2.1.0'}); first fixed release: "
          f"{result['first_fixed'] or 'none in the range'} (declared: {regression.first_fixed})")
    ranges = result.get("ranges")
    if ranges:
        print(f"{regression.id}: observed affected: {', '.join(ranges['observed']) or 'none'}; declared "
              f"{ranges['declared']}, over the swept releases: {', '.join(ranges['declared_over_swept']) or 'none'}")
        if ranges["not_applicable"]:
            print(f"{regression.id}: not applicable (the API does not exist yet): {', '.join(ranges['not_applicable'])}")
        print(f"{regression.id}: " + (f"observed and declared disagree on {'; '.join(ranges['disagree'])}"
                                      if ranges["disagree"] else "observed and declared agree on every judged release"))
    if result["not_monotonic"]:
        print(f"not monotonic: reproduces again in {', '.join(result['not_monotonic'])} after a release that passed")
    if reason := incomplete_reason(result["run"]):  # first and last releases named from partial results
        print(f"repro: {reason}", file=sys.stderr)
        return 1
    return 0


def cmd_regressions(args: argparse.Namespace) -> int:
    rows = [[r.id, r.title, r.upstream, str(r.affected), r.scenario.name, ", ".join(r.patches)]
            for r in REGRESSIONS.values()]
    print(tabulate(rows, headers=["id", "title", "upstream", "affected releases", "scenario", "patches"]))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=1))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from harness.targets.devices import unavailable_reasons

    rows = [[device, "available" if reason is None else "unavailable", reason or ""]
            for device, reason in unavailable_reasons().items()]
    print(tabulate(rows, headers=["device", "status", "reason"]))
    print(sandbox.status_line())
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    validate.check_only(args.only)
    for selection in generate(args.matrix, args.only, args.max_cases):
        regression, cases = selection.regression, selection.cases
        print(f"{regression.id}: {regression.title}")
        rows = []
        for axis, values in regression.axes.items():
            counts = Counter(getattr(c, axis) for c in cases)
            rows += [[axis, value, counts[value]] for value in values if counts[value]]
        print(tabulate(rows, headers=["axis", "value", "cases"]))
        predicted = Counter(p.rule.name if p.rule else "(unaffected)" for p in map(regression.predict, cases))
        print()
        print(tabulate(sorted(predicted.items()), headers=["rule", "cases it predicts affected"]))
        print()
        print(tabulate(selection.excluded.most_common(), headers=["excluded because", "combinations"]))
        print(f"\n{len(cases)} valid cases per target; {sum(selection.excluded.values())} combinations excluded\n")
    return 0


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("--matrix", default="issue22",
                           help=f"(default issue22) a regression id, a preset or all: {', '.join(matrix_names())}")
    selection.add_argument("--only", action="append", metavar="AXIS=V[,V]", help="keep only these axis values")
    selection.add_argument("--max-cases", type=validate.positive_int, default=MAX_CASES_DEFAULT,
                           help="refuse larger selections")

    p = sub.add_parser("run", parents=[common, selection], help="run a case matrix over targets")
    p.add_argument("--targets", metavar="A,B,...",
                   help="comma-separated specs (default: each regression's own default targets); a spec is "
                   f"{targets.SPEC_FORMS}; +name is a patch only when patches/name.toml exists")
    p.add_argument("--target", action="append", metavar="SPEC",
                   help="one more target, never split at commas (for a path holding a comma); repeatable")
    p.add_argument("--fork-config", metavar="FILE",
                   help="a fork's TOML config for the path: and installed targets (default: <tree>/.te-repro.toml)")
    p.add_argument("--out", help="run dir (default runs/<matrix>); one run at a time; never inside a source or "
                   "the cache")
    p.add_argument("-n", "--workers", type=validate.worker_count, default=min(2, validate.usable_cpus()),
                   help="xdist workers per target (1 or more)")
    p.add_argument("--tx", action="append", metavar="SPEC",
                   help="pytest-xdist worker spec for each target's session, instead of -n local workers; repeatable "
                   "(e.g. 2*popen, ssh=HOST//python=PY); see the README's 'Several hosts'")
    p.add_argument("--rsyncdir", action="append", metavar="DIR",
                   help="with a remote --tx: one more directory for xdist to copy to the workers (the harness and "
                   "the session's case file are copied already); repeatable")
    p.add_argument("--perf", action="store_true", help="also benchmark the matrix (as repro bench) into the reports")
    p.add_argument("--refuse-device-calls", action="store_true",
                   help="during each case, refuse the CUDA calls of TE's files (torch.cuda.*, .cuda(), CUDA"
                   " factories) as a host without CUDA does, instead of answering them; each shows as a crash"
                   " DeviceCallRefused naming the call and its TE file and line")
    p.add_argument("--case-timeout", type=validate.timeout_seconds, default=CASE_TIMEOUT_S,
                   help="seconds (above 0) before a case is recorded as hung; its worker is ended if it does not stop")
    p.add_argument("--load-timeout", type=validate.timeout_seconds, default=LOAD_TIMEOUT_S,
                   help="CPU seconds (above 0) a worker may spend importing torch and loading the target, or "
                   "spend without any CPU (scaled by the machine's load); past it the target is recorded as "
                   "failing to load")
    p.add_argument("--max-rss", type=validate.max_rss_bytes, metavar="GIB",
                   help="memory (GiB) each worker may hold; a case over it is recorded as over the bound "
                   "(default: 80%% of the machine's memory over the workers)")
    p.add_argument("--from-run", metavar="DIR", help="re-run results of this stored run (with --verdict or --last-failed)")
    p.add_argument("--verdict", metavar="V[,V]", help="with --from-run: the results with these verdicts (or missing)")
    p.add_argument("--last-failed", action="store_true",
                   help="with --from-run: the results that made it FAIL (other_failure, regression, unexpected_pass,"
                        " harness_error) and those it never wrote")
    p.add_argument("--case", action="append", metavar="ID", help="run this case id (repeatable)")
    p.add_argument("--megatron", metavar="VERSION|path:DIR",
                   help=f"the megatron-core the Megatron cases import: a release (default {DEFAULT_VERSION}, fetched "
                   "into the cache) or path:<dir holding megatron/core>")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("list", parents=[selection], help="count cases per axis value without running")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("sweep", parents=[common, selection], help="run the matrix over every release in a range")
    p.add_argument("--from", dest="from_version", default="2.1.0", help="oldest release (default 2.1.0)")
    p.add_argument("--to", dest="to_version", default="latest", help="newest release, or latest")
    p.add_argument("--out", help="run dir (default runs/sweep-<matrix>)")
    p.add_argument("-n", "--workers", type=validate.worker_count, default=min(2, validate.usable_cpus()),
                   help="parallel sessions (1 or more)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("regressions", help="list the regression catalogue")
    p.set_defaults(func=cmd_regressions)

    p = sub.add_parser("schema", help="print the JSON Schema of run.json (repro.run/2)")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("devices", help="list devices with their status or the reason they are unavailable")
    p.set_defaults(func=cmd_devices)
