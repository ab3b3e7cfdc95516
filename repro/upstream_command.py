"""`repro upstream-tests`: a TE checkout's own fuser tests, run against targets on the CPU.

Upstream's `tests/pytorch/test_fusible_ops.py` lives in TE's git repository, not in the
wheel. Its tests default to `device="cuda"`; those that run on the CPU (a `cpu` device
parametrization, as a string or a `torch.device`, or no device argument at all) are kept by
a pytest plugin of ours (harness.runner.upstream_selection), the others deselected. FP8 cases skip through upstream's own `maybe_skip_quantization`, since the CPU
backend is a device without FP8. Each target runs in its own `repro exec` process; the counts
come from pytest's junit XML, written to a temporary directory (never into the checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from tabulate import tabulate

from harness import targets
from harness.errors import UsageError
from harness.targets import revisions, sources

FUSER_TESTS = "tests/pytorch/test_fusible_ops.py"
EXAMPLE = "example: repro upstream-tests --target path:../TransformerEngine  (or --tests DIR --target te-2.13.0)"


@contextlib.contextmanager
def _tests_file(args: argparse.Namespace) -> Iterator[Path]:
    """The test file to run: from --tests, else from the first path: target, at its revision
    where it names one (`path:DIR@REV`: exported with git into a temporary directory)."""
    rev = None
    if args.tests:
        root = Path(args.tests).expanduser()
    else:
        paths = [targets.parse_spec(s) for s in args.target if targets.parse_spec(s).kind == "path"]
        if not paths:
            raise UsageError(f"no checkout to take the tests from: give --tests DIR or a path: target; {EXAMPLE}")
        directory, rev = revisions.split(paths[0].value)
        root = Path(directory).expanduser()
    if rev is not None:
        with tempfile.TemporaryDirectory(prefix="repro-upstream-tests-") as tmp:
            exported = revisions.export_path(root, rev, str(Path(FUSER_TESTS).parent), Path(tmp))
            yield exported / Path(FUSER_TESTS).name
        return
    found = root / FUSER_TESTS
    if not found.is_file():
        raise UsageError(f"{root} has no {FUSER_TESTS}; give a TE git checkout (the wheel ships no tests)")
    yield found.resolve()


def _counts(junit: Path) -> dict[str, int]:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    if suite is None:
        return {}
    total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


def run_upstream_tests(spec: str, tests: Path, keyword: str | None, extra: list[str], args: argparse.Namespace
                       ) -> tuple[dict[str, int], int]:
    """One target's run: its counts, and pytest's exit status."""
    from harness.targets.site import exec_environment

    prepared = targets.prepare(spec, sources.cache_dir(args.cache_dir), args.offline)
    if prepared.patch_status == "conflict":
        raise UsageError(f"target {prepared.spec}: patch {prepared.patch} does not apply; pick another target")
    with tempfile.TemporaryDirectory(prefix="repro-upstream-") as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", str(tests), *(["-k", keyword] if keyword else []),
                   "-p", "harness.runner.upstream_selection", "-p", "no:cacheprovider", "-q",
                   f"--junitxml={junit}", "-o", "junit_family=xunit2", *extra]
        # From the temporary directory: plugins that write beside the working directory
        # (pytest-benchmark's .benchmarks) write there, never into the checkout.
        status = subprocess.run(command, cwd=tmp, env=exec_environment(prepared, False, dict(os.environ)),
                                check=False).returncode
        return (_counts(junit) if junit.is_file() else {}), status


def cmd_upstream_tests(args: argparse.Namespace) -> int:
    with _tests_file(args) as tests:
        return _run_all(args, tests)


def _run_all(args: argparse.Namespace, tests: Path) -> int:
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    rows, worst = [], 0
    for spec in args.target:
        counts, status = run_upstream_tests(spec, tests, args.keyword, extra, args)
        if not counts:
            rows.append([spec, "-", "-", "-", f"no results (pytest exit {status})"])
            worst = max(worst, 1)
            continue
        # Nothing judged is never a pass: every test skipped (needs CUDA, FP8) says so, and fails.
        verdict = "FAILED" if status else "nothing passed" if not counts["passed"] else "ok"
        rows.append([spec, counts["passed"], counts["failed"], counts["skipped"], verdict])
        worst = max(worst, 0 if verdict == "ok" else 1)
    print(f"upstream tests: {tests}, those that run on the CPU" + (f", -k {args.keyword!r}" if args.keyword else ""))
    print(tabulate(rows, headers=["target", "passed", "failed", "skipped", "status"], tablefmt="simple"))
    return worst


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "upstream-tests", parents=[common], help="run a TE checkout's own fuser tests against targets on the CPU",
        description=("Runs the checkout's tests/pytorch/test_fusible_ops.py under `repro exec` for each target and "
                     "reports passed/failed/skipped per target, of the tests that run on the CPU (a cpu device "
                     "parametrization, or no device argument); FP8 cases skip by upstream's own logic (a device without FP8). Exit 1 when a target "
                     "has a failure, no results, or none passed."),
        epilog=EXAMPLE)
    p.add_argument("--target", action="append", required=True, metavar="SPEC",
                   help=f"a TE to run the tests against, repeatable ({targets.SPEC_FORMS})")
    p.add_argument("--tests", metavar="DIR", help="the TE checkout holding the tests (default: the path: target)")
    p.add_argument("-k", dest="keyword", help="pytest -k expression, within the tests that run on the CPU")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS", help="more pytest arguments")
    p.set_defaults(func=cmd_upstream_tests)
