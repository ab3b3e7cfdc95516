"""`repro report`, `repro show` and `repro diff`: reading runs, never running them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.errors import UsageError
from harness.runner import rundir
from harness.targets import sources
from repro import formats, reports, validate


def write_stdout(text: str) -> None:
    """Print; a reader that closed the pipe (`| head`) ends it quietly, without a traceback."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _write(text: str, out: str | None) -> None:
    if out is None:
        write_stdout(text)
        return
    rundir.check_regular_output(Path(out), "-o")
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {out} ({exc.strerror})") from None
    rundir.write_atomic(Path(out), text)


def cmd_report(args: argparse.Namespace) -> int:
    if args.output:
        rundir.check_report_output(Path(args.output), Path(args.run_dir))
        rundir.check_regular_output(Path(args.output), "-o")
    formats.check_step_summary(Path(args.run_dir) if Path(args.run_dir).is_dir() else Path(args.run_dir).parent,
                               Path(args.output) if args.output else None)
    run = reports.load_run(Path(args.run_dir))
    if args.output:
        validate.check_out(Path(args.output), reports.target_specs(run), sources.cache_path())
    _write(formats.render(run, args.format), args.output)
    formats.append_step_summary(run)  # GitHub Actions: the summary on the job's page
    if note := reports.incomplete_note(run):
        print(f"repro: {note}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from cases.matrix import exclusion
    from cases.regressions import REGRESSIONS
    from harness.engine.script import DEFAULT_TARGET, parse_case_id, render_script
    from harness.engine.standalone import standalone_refusal

    case = parse_case_id(args.case_id)
    if args.standalone and not args.script:
        raise UsageError("--standalone goes with --script; e.g. repro show CASE_ID --script --standalone")
    if args.script and args.standalone:
        from harness.engine.standalone import write_standalone

        sys.stdout.write(write_standalone(case, args.target or DEFAULT_TARGET))
        return 0
    if args.script:
        sys.stdout.write(render_script(args.case_id, args.target or DEFAULT_TARGET))
        return 0
    for axis, value in case.as_dict().items():
        print(f"{axis:10} {value}")
    regression = REGRESSIONS[case.regression]
    prediction = regression.predict(case)
    symptom = f", {prediction.rule.symptom.description}" if prediction.rule else ""
    print(f"predicted  {prediction.expected}{symptom}: {prediction.reason}")
    reason = exclusion(case)
    print(f"excluded   {reason}" if reason else "valid      yes")
    target = args.target or regression.default_targets[0]
    print(f"\nreproduce: {reports.reproduce_command(case.case_id, target, standalone_refusal(case) is None)}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from repro import diff

    maps = diff.parse_maps(args.map)
    a, b = reports.load_run(Path(args.a)), reports.load_run(Path(args.b))
    comparison = diff.compare(a, b, maps)
    write_stdout(diff.render_diff(comparison, a, b, args.format))
    return diff.exit_status(comparison.changes, a, b)


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("report", help="render a run dir as Markdown, HTML, JUnit XML, JSON or a CI summary",
                       epilog="example: repro report runs/issue22 --format html -o report.html")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run dir (run.json, or results.jsonl if unfinished)")
    p.add_argument("--format", choices=formats.FORMATS, default="md",
                   help="md (default): for a pull request; verdict-md: the reviewed report, without timings or"
                        " machine details; summary: the short form that $GITHUB_STEP_SUMMARY also gets when set")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("show", help="a case's axes and oracle prediction, or a script that reproduces it",
                       epilog="example: repro show CASE_ID --target te-2.13.0 --script --standalone > case.py")
    p.add_argument("case_id", metavar="CASE_ID")
    p.add_argument("--target", metavar="SPEC", help="target for the script (default te-2.13.0)")
    p.add_argument("--script", action="store_true",
                   help="print a Python script that runs the case through the harness (default: print the axes)")
    p.add_argument("--standalone", action="store_true",
                   help="with --script: a script that needs only torch and TE (import transformer_engine.pytorch"
                        " as te), for an upstream bug report; run it here with repro exec")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("diff", help="cases whose outcome, verdict, error or failed checks changed between two runs;"
                       " exit 1 on a new regression (a paired case that passed and now fails) or an incomplete run",
                       epilog="example: repro diff runs/before runs/after --map path:fork-old=path:fork-new")
    p.add_argument("a", metavar="A", help="the earlier run: a run dir or run.json")
    p.add_argument("b", metavar="B", help="the later run: a run dir or run.json")
    p.add_argument("--map", action="append", metavar="A_SPEC=B_SPEC",
                   help="pair this target of A with this one of B (repeatable); the others pair by the same spec,"
                        " else by the same role")
    p.add_argument("--format", choices=("text", "md"), default="text", help="text (default) or md (for a pull request)")
    p.set_defaults(func=cmd_diff)
