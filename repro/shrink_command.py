"""`repro shrink CASE_ID --target SPEC`: a failing case reduced to a minimal one that fails with the
same signature (harness.runner.shrink), each round's candidates run as one `repro run` into a folder of
its own under --out, and the minimum written as a standalone reproducer where one can be."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cases.case import Case
from cases.matrix import selections_of
from harness.errors import UsageError
from harness.runner.signature import Signature, signature, signature_text

EXAMPLE = ("example: repro shrink 'generated:ops-gen.linear.extra_out_ip.linear-enabled-non_leaf-trainable-none-"
           "single-expanded-bfloat16-cpu' --target te-2.13.0")


class RoundRunner:
    """Runs a round's cases on the target with `repro run`, each round in its own run dir."""

    def __init__(self, spec: str, out: Path, args: argparse.Namespace) -> None:
        self.spec, self.out, self.args, self.rounds = spec, out, args, 0

    def __call__(self, cases: list[Case]) -> dict[str, Signature | None]:
        from repro.reports import load_run

        run_dir = self.out / f"round-{self.rounds}"
        self.rounds += 1
        command = [sys.executable, "-m", "repro", "run", "--target", self.spec, "--out", str(run_dir), "-n", "1"]
        command += [a for c in cases for a in ("--case", c.case_id)]
        if self.args.cache_dir:
            command += ["--cache-dir", self.args.cache_dir]
        if self.args.offline:
            command.append("--offline")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 2 or not (run_dir / "run.json").is_file():
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise UsageError(f"repro run of round {self.rounds - 1} gave no results: {last}")
        return {r["case_id"]: signature(r) for r in load_run(run_dir)["results"] if r.get("target") == self.spec}


def cmd_shrink(args: argparse.Namespace) -> int:
    from harness.runner.shrink import shrink

    [selection] = selections_of([args.case])  # a bad id: one line, exit 2
    case = selection.cases[0]
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty; give a new folder for the shrink's runs")
    runner = RoundRunner(args.target, out, args)
    wanted = runner([case]).get(case.case_id)
    if wanted is None or wanted[0] == "pass":
        print(f"{case.case_id} does not fail on {args.target} ({'passes' if wanted else 'not judged'}): nothing to shrink")
        return 1
    shrunk = shrink(case, wanted, runner)
    print(f"signature: {signature_text(wanted)}")
    print(f"from:    {case.case_id}")
    for step in shrunk.steps:
        print(f"  - {step}")
    print(f"minimal: {shrunk.minimal.case_id}  ({shrunk.tried} candidates in {runner.rounds - 1} rounds; runs under {out})")
    _write_reproducer(shrunk.minimal, args.target, out)
    return 0


def _write_reproducer(case: Case, spec: str, out: Path) -> None:
    from harness.engine.standalone import standalone_refusal, write_standalone

    if refusal := standalone_refusal(case):
        print(f"no standalone reproducer: {refusal}")
        return
    script = out / "minimal.py"
    script.write_text(write_standalone(case, spec))
    print(f"reproducer: {script}  (repro exec --target {spec} -- python {script})")


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "shrink", parents=[common], help="reduce a failing case to a minimal one that fails the same way",
        description=("Runs the case on the target, then one-step simplifications of it (an op fewer, a simpler grad"
                     " mode, input, wrapper, gradient form or dtype), keeping each that fails with the same signature"
                     " (outcome, error type, TE file, failed checks), until none does; writes the minimum's standalone"
                     " reproducer. Exit status 0 when shrunk, 1 when the case does not fail, 2 on bad input."),
        epilog=EXAMPLE)
    p.add_argument("case", metavar="CASE_ID", help="the case to shrink (as reports and repro list name it)")
    p.add_argument("--target", required=True, metavar="SPEC", help="the target it fails on")
    p.add_argument("--out", default="runs/shrink", help="a new folder for the rounds' runs (default runs/shrink)")
    p.set_defaults(func=cmd_shrink)
