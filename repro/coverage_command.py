"""`repro coverage RUN_DIR`: for each target of a stored run, the `te.ops` basic and fused ops
its cases reached, and why each other one was not (harness.runner.coverage). The target's inventory is
read off TE's own classes in a `repro exec` process of that target."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

from harness import targets
from harness.errors import UsageError
from harness.runner import sandbox, scratch
from harness.runner.coverage import coverage, summary
from harness.targets import sources

EXAMPLE = "example: repro run --matrix generated --out runs/generated && repro coverage runs/generated"


def inventory(spec: str, cache_dir: str | None, offline: bool) -> dict[str, list[str]]:
    """The target's basic and fused op classes, listed in a process that loaded it."""
    from harness.targets.site import exec_environment

    prepared = targets.prepare(spec, sources.cache_dir(cache_dir), offline)
    with scratch.temporary() as scratch_env:
        done = subprocess.run(sandbox.command([sys.executable, "-m", "harness.targets.inventory"]), capture_output=True,
                              text=True,
                              env=exec_environment(prepared, False, {**os.environ, **scratch_env}), check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise UsageError(f"target {spec} could not be loaded to list its ops: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cmd_coverage(args: argparse.Namespace) -> int:
    from repro.reports import incomplete_note, load_run

    run = load_run(Path(args.run))
    specs = [t["spec"] for t in run.get("environment", {}).get("targets", [])]
    chosen = [args.target] if args.target else specs
    unknown = [s for s in chosen if s not in specs]
    if unknown:
        raise UsageError(f"target {unknown[0]} is not in the run; its targets: {', '.join(specs)}")
    for spec in chosen:
        rows = coverage(inventory(spec, args.cache_dir, args.offline),
                        [r for r in run.get("results", []) if r.get("target") == spec])
        print(f"{spec}: {summary(rows)}")
        print(tabulate([(r.kind, r.name, "reached" if r.reached else "not reached", r.how) for r in rows],
                       headers=("kind", "op", "", "how / why not"), tablefmt="simple", maxcolwidths=[None, None, None, 90]))
        print()
    if note := incomplete_note(run):  # an op its lost results reached would read as not reached
        print(f"{note} The listing covers the results the run holds.")
        return 1
    return 0


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "coverage", parents=[common], help="the te.ops basic and fused ops a run reached on each target, and why not",
        description=("Lists, for each target of a stored run, every basic op and fused op its te.ops holds (read off"
                     " TE's own classes), whether a case of the run reached it, and why not: the op database's reason,"
                     " a fusion pass's condition, or no entry. Exit status 1 when the run is incomplete."),
        epilog=EXAMPLE)
    p.add_argument("run", metavar="RUN_DIR", help="a run dir (or its run.json)")
    p.add_argument("--target", metavar="SPEC", help="only this target of the run")
    p.set_defaults(func=cmd_coverage)
