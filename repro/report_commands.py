"""`repro report`, `repro show` and `repro diff`: reading runs, never running them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import UsageError
from harness.runner import rundir
from repro import reports


def _write(text: str, out: str | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {out} ({exc.strerror})") from None
    rundir.write_atomic(Path(out), text)


def cmd_report(args: argparse.Namespace) -> int:
    if args.output:
        rundir.check_report_output(Path(args.output), Path(args.run_dir))
    run = reports.load_run(Path(args.run_dir))
    _write(reports.render(run, args.format), args.output)
    if note := reports.incomplete_note(run):
        print(f"repro: {note}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from cases import issue22
    from cases.matrix import skip_reason
    from harness.engine.script import DEFAULT_TARGET, parse_case_id, render_script

    case = parse_case_id(args.case_id)
    if args.script:
        sys.stdout.write(render_script(case.case_id, args.target or DEFAULT_TARGET))
        return 0
    for axis, value in case.as_dict().items():
        print(f"{axis:10} {value}")
    prediction = issue22.predict(case)
    effect = f", {prediction.effect}" if prediction.effect else ""
    print(f"oracle     {prediction.expected}{effect}: {prediction.reason}")
    reason = skip_reason(case)
    print(f"skipped    {reason}" if reason else "runnable   yes")
    target = args.target or DEFAULT_TARGET
    print(f"\nreproduce: {reports.show_command(case.case_id, target)} > case.py && python case.py")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from repro import diff

    a, b = reports.load_run(Path(args.a)), reports.load_run(Path(args.b))
    changes = diff.compare(a, b)
    print(diff.render_diff(changes, a, b))
    return diff.exit_status(changes)


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("report", help="render a run dir as Markdown, HTML, JUnit XML or JSON")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run dir (run.json, or results.jsonl if unfinished)")
    p.add_argument("--format", choices=reports.FORMATS, default="md",
                   help="verdict-md: the reviewed report, without timings or machine details")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("show", help="a case's axes and oracle prediction, or its reproduction script")
    p.add_argument("case_id", metavar="CASE_ID")
    p.add_argument("--target", metavar="SPEC", help="target for the script (default te-2.13.0)")
    p.add_argument("--script", action="store_true", help="print a standalone Python script that runs the case")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("diff", help="cases whose outcome or verdict changed between two runs; exit 1 on a new regression")
    p.add_argument("a", metavar="A", help="the earlier run: a run dir or run.json")
    p.add_argument("b", metavar="B", help="the later run: a run dir or run.json")
    p.set_defaults(func=cmd_diff)
