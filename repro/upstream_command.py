"""`repro upstream-tests`: a TE checkout's own fuser tests, run against targets on the CPU.

Upstream's `tests/pytorch/test_fusible_ops.py` lives in TE's git repository, not in the
wheel. Its tests default to `device="cuda"`: a pytest plugin of ours
(harness.runner.upstream_selection) places them on the CPU backend, where quantized variants
skip through upstream's own `maybe_skip_quantization`; a CUDA parametrization beside a CPU one
is deselected. Upstream's CI environment for the test file at that revision is applied
(harness.runner.upstream_ci). Each target runs in its own `repro exec` process; the counts and
the failures, each explained in one line (harness.runner.upstream_failures), come from
pytest's junit XML, written to a temporary directory (never into the checkout).
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
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from harness import targets
from harness.errors import UsageError
from harness.runner import sandbox, scratch, upstream_diff, upstream_failures
from harness.runner.upstream_ci import CI_SCRIPT, ci_environment
from harness.targets import revisions, sources

FUSER_TESTS = "tests/pytorch/test_fusible_ops.py"
EXAMPLE = "example: repro upstream-tests --target path:../TransformerEngine  (or --tests DIR --target te-2.13.0)"


@contextlib.contextmanager
def _tests_file(args: argparse.Namespace) -> Iterator[Path]:
    """The test file to run: from --tests, else from the first path: target."""
    if args.tests:
        found = Path(args.tests).expanduser() / FUSER_TESTS
        if not found.is_file():
            raise UsageError(f"{args.tests} has no {FUSER_TESTS}; give a TE git checkout (the wheel ships no tests)")
        yield found.resolve()
        return
    paths = [s for s in args.target if targets.parse_spec(s).kind == "path"]
    if not paths:
        raise UsageError(f"no checkout to take the tests from: give --tests DIR or a path: target; {EXAMPLE}")
    with tests_of(paths[0]) as found:
        yield found


@contextlib.contextmanager
def tests_of(spec: str) -> Iterator[Path]:
    """The fuser test file of a path: tree, at its revision where it names one (`path:DIR@REV`:
    exported with git, with upstream's CI script, into a temporary directory)."""
    parsed = targets.parse_spec(spec)
    if parsed.kind != "path":
        raise UsageError(f"{spec} is not a checkout (the wheel ships no tests); give path:DIR or path:DIR@REV")
    directory, rev = revisions.split(parsed.value)
    root = Path(directory).expanduser()
    if rev is not None:
        with tempfile.TemporaryDirectory(prefix="repro-upstream-tests-") as tmp:
            exported = revisions.export_path(root, rev, str(Path(FUSER_TESTS).parent), Path(tmp))
            with contextlib.suppress(UsageError):  # a revision before upstream's CI script
                revisions.export_path(root, rev, str(Path(CI_SCRIPT).parent), Path(tmp))
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


def _checkout_root(tests: Path) -> Path:
    return tests.parents[len(Path(FUSER_TESTS).parts) - 1]


@dataclass
class UpstreamRun:
    """One target's run of the fuser tests: pytest's exit status, and from its junit XML the
    counts, each test's outcome, and the failed and skipped tests with their reasons (empty
    when pytest wrote none)."""

    status: int
    counts: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    failed: list[upstream_failures.Failure] = field(default_factory=list)
    skipped: list[upstream_failures.Failure] = field(default_factory=list)


def run_upstream_tests(spec: str, tests: Path, keyword: str | None, extra: list[str], cache_dir: str | None,
                       offline: bool) -> UpstreamRun:
    """One target's run of `tests`, with upstream's CI environment of the checkout they come from."""
    from harness.targets.site import exec_environment

    sandbox.require()
    prepared = targets.prepare(spec, sources.cache_dir(cache_dir), offline)
    if prepared.patch_status == "conflict":
        raise UsageError(f"target {prepared.spec}: patch {prepared.patch} does not apply; pick another target")
    ci_env, _ = ci_environment(_checkout_root(tests) / CI_SCRIPT)
    with tempfile.TemporaryDirectory(prefix="repro-upstream-") as tmp, scratch.scratch(Path(tmp)) as scratch_env:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", str(tests), *(["-k", keyword] if keyword else []),
                   "-p", "harness.runner.upstream_selection", "-p", "no:cacheprovider", "-q",
                   f"--junitxml={junit}", "-o", "junit_family=xunit2", *extra]
        # From the temporary directory: plugins that write beside the working directory
        # (pytest-benchmark's .benchmarks) write there, never into the checkout.
        # Their temporary files too (pytest's basetemp, torch's cache folder): nothing left in the machine's /tmp.
        env = exec_environment(prepared, False, {**os.environ, **ci_env, **scratch_env}, (tests.parent,))
        status = subprocess.run(sandbox.command(command, writable=[tmp]), cwd=tmp, env=env, check=False).returncode
        if not junit.is_file():
            return UpstreamRun(status)
        return UpstreamRun(status, _counts(junit), upstream_failures.outcomes(junit), upstream_failures.failures(junit),
                           upstream_failures.skips(junit))


def cmd_upstream_tests(args: argparse.Namespace) -> int:
    with _tests_file(args) as tests:
        return _run_all(args, tests)


def _run_all(args: argparse.Namespace, tests: Path) -> int:
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    ci_env, ci_where = ci_environment(_checkout_root(tests) / CI_SCRIPT)
    rows, worst, explained, skipped = [], 0, [], []
    for spec in args.target:
        result = run_upstream_tests(spec, tests, args.keyword, extra, args.cache_dir, args.offline)
        counts, status = result.counts, result.status
        explained += [[spec, reason, n, test] for reason, n, test in upstream_failures.by_reason(result.failed)]
        skipped += [[spec, reason, n] for reason, n, _ in upstream_failures.by_reason(result.skipped)]
        problem = upstream_diff.run_problem(counts, status)
        if problem == "no results":
            rows.append([spec, "-", "-", "-", "-", f"no results (pytest exit {status})"])
            worst = max(worst, 1)
            continue
        # Nothing judged is never a pass: every test skipped (needs CUDA, FP8) says so, and fails.
        verdict = "FAILED" if status else problem or "ok"
        ran = counts["passed"] + counts["failed"]
        share = f"{100 * counts['passed'] / ran:.1f}%" if ran else "-"
        rows.append([spec, counts["passed"], counts["failed"], counts["skipped"], share, verdict])
        worst = max(worst, 0 if verdict == "ok" else 1)
    print(f"upstream tests: {tests}, on the CPU" + (f", -k {args.keyword!r}" if args.keyword else ""))
    setting = " ".join(f"{k}={v}" for k, v in ci_env.items()) or "nothing set"
    print(f"upstream CI environment: {setting} ({ci_where})")
    print(tabulate(rows, headers=["target", "passed", "failed", "skipped", "passed of run", "status"], tablefmt="simple"))
    if explained:
        print("\nfailures, each explained:")
        print(tabulate(explained, headers=["target", "why", "tests", "e.g."], tablefmt="simple"))
    if skipped:
        print("\nskipped, by reason:")
        print(tabulate(skipped, headers=["target", "why", "tests"], tablefmt="simple"))
    return worst


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "upstream-tests", parents=[common], help="run a TE checkout's own fuser tests against targets on the CPU",
        description=("Runs the checkout's tests/pytorch/test_fusible_ops.py under `repro exec` for each target, "
                     "its CUDA tests placed on the CPU backend and upstream's CI environment for the file applied, "
                     "and reports passed/failed/skipped per target with each failure explained in one line; "
                     "quantized cases skip by upstream's own logic (a device without FP8). Exit 1 when a target "
                     "has a failure, no results, or none passed."),
        epilog=EXAMPLE)
    p.add_argument("--target", action="append", required=True, metavar="SPEC",
                   help=f"a TE to run the tests against, repeatable ({targets.SPEC_FORMS})")
    p.add_argument("--tests", metavar="DIR", help="the TE checkout holding the tests (default: the path: target)")
    p.add_argument("-k", dest="keyword", help="pytest -k expression, within the tests that run on the CPU")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS", help="more pytest arguments")
    p.set_defaults(func=cmd_upstream_tests)
