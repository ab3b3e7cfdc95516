"""`repro minimal --client`: the bug report's scenario through Megatron's own modules. Printing only."""

from __future__ import annotations

import argparse
from pathlib import Path

from tabulate import tabulate

from harness import targets
from harness.errors import UsageError
from harness.megatron.source import DEFAULT_VERSION, prepare_megatron
from harness.megatron.worker import run_in_subprocess


def check_client_args(args: argparse.Namespace) -> None:
    from harness.megatron.minimal import RECOMPUTES  # here: it imports torch, which the CLI does not need

    if args.client not in RECOMPUTES:
        raise UsageError(f"unknown client {args.client!r}; valid: {', '.join(RECOMPUTES)}")
    if args.recompute is not None and args.recompute not in RECOMPUTES[args.client]:
        raise UsageError(f"--recompute {args.recompute!r} is not one of {args.client}'s: "
                         f"{', '.join(RECOMPUTES[args.client])}")


def minimal_client(args: argparse.Namespace, prepared: targets.PreparedTarget, cache: Path) -> int:
    megatron = prepare_megatron(args.megatron or DEFAULT_VERSION, cache, args.offline)
    report = run_in_subprocess(prepared, megatron, [(args.client, args.recompute)])
    if report["load_error"]:
        print(f"{prepared.spec} with megatron-core {megatron.version}: could not load: {report['load_error']}")
        return 1
    outcome = report["results"][0]
    print(f"target {prepared.spec} (fuser.py {prepared.fuser_sha}, patch {prepared.patch_status}); "
          f"megatron-core {megatron.version} ({megatron.source})")
    print(f"scenario: {outcome['client']}, recompute {outcome['recompute']}: {outcome['description']}, "
          "on a non-leaf input that requires grad")
    if outcome["completed"]:
        verdict = "matched" if outcome["matched"] else "DID NOT match"
        compared = outcome["compared"]
        print(f"completed: forward and backward; outputs ({compared['outputs']}) and gradients (input and "
              f"{compared['parameter_grads']} parameters) {verdict} the reference ({outcome['description'].split('reference: ')[-1]})")
        for failure in outcome["failures"]:
            print(f"  {failure}")
        return 0
    error = outcome["error"]
    print("frames from Megatron's layer down to fuser.py:")
    for frame in outcome["frames"]:
        print(f"  {frame['file']}:{frame['line']} in {frame['function']}")
        if frame["code"]:
            print(f"      {frame['code']}")
    print(f"{error['type']}: {error['message']}")
    print("the bug report's frames in this traceback:")
    rows = [[r["expected_file"], r["expected_function"], r["report_line"] or "-", r["observed"] or "MISSING",
             "yes" if r["in_order"] else "NO"] for r in outcome["frame_table"]]
    print(tabulate(rows, headers=["report frame", "function", "report line", "observed", "in order"]))
    print("matches the report (frames, order, error): " + ("yes" if outcome["matches_report"] else "NO"))
    return 0
