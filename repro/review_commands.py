"""`repro review`: the upstream-sync reviewer's command. It runs the matrix on the base and
head trees (each also with the fork's patches that apply) as one run, then writes the
review: review.md (for the pull request) and review.json beside the run's own reports."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cases.matrix import generate, matrix_names
from harness import targets
from harness.errors import UsageError
from harness.runner import rundir, upstream_diff
from harness.runner.review import patch_assessments, patched_regressions, review_specs
from harness.runner.sessions import CASE_TIMEOUT_S, Interrupted, run_matrix
from harness.targets import sources
from harness.targets.history import ops_changes
from repro import review_bisect, validate
from repro.formats import check_step_summary, write_all_formats
from repro.progress import Progress
from repro.render_review import github_annotations, render_review, terminal_line
from repro.reports import summarize
from repro.review import review, verdict_of


def _check_tree_spec(option: str, spec: str) -> None:
    parsed = targets.parse_spec(spec)
    if parsed.patch:
        raise UsageError(f"{option} {spec}: give the tree without +{parsed.patch}; the review adds every patch"
                         " that applies")


def _check_two_commits(base: targets.PreparedTarget, head: targets.PreparedTarget) -> None:
    """Two names of one commit of one repository (`@main` and `@HEAD`) are one tree too."""
    ends = [(p.provenance or {}).get("revision", "").rpartition("@")[0] for p in (base, head)]
    commits = [(p.provenance or {}).get("git_commit", "") for p in (base, head)]
    if all(ends) and commits[0] and commits[0] == commits[1] and Path(ends[0]).resolve() == Path(ends[1]).resolve():
        raise UsageError(f"--base {base.spec} and --head {head.spec} are both commit {commits[0][:12]}; give two"
                         " trees or two revisions")


def cmd_review(args: argparse.Namespace) -> int:
    from repro.run_commands import megatron_env, megatron_for_run

    for option, spec in (("--base", args.base), ("--head", args.head)):
        _check_tree_spec(option, spec)
    if (tree := targets.canonical_spec(args.base)) == targets.canonical_spec(args.head):  # path:X and path:X/ too
        raise UsageError(f"--base and --head are both {tree}; give two trees or two revisions (path:DIR@REV)")
    validate.check_only(args.only)
    if args.upstream_tests:
        from repro.upstream_command import tests_of

        for spec in (args.base, args.head):
            with tests_of(spec):  # a tree without the tests is refused before anything runs
                pass
    validate.check_fork_config(args.fork_config, [args.base, args.head])
    targets.check_available([args.base, args.head])
    planned = generate(args.matrix, args.only, args.max_cases)
    out_dir = Path(args.out or Path("runs") / "review")
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, [args.base, args.head], cache)
    check_step_summary(out_dir)  # the reports append to it at the end
    prepared = {spec: targets.prepare(spec, cache, args.offline, args.fork_config) for spec in (args.base, args.head)}
    _check_two_commits(prepared[args.base], prepared[args.head])
    regressions = [s.regression.id for s in planned]
    assessed = {spec: patch_assessments(p, regressions) for spec, p in prepared.items()}
    specs = review_specs(args.base, args.head, assessed)
    megatron = megatron_for_run(args.megatron, planned, out_dir, cache, args.offline)
    with rundir.claim(out_dir), megatron_env(megatron):
        progress = Progress()
        started = time.time()
        try:
            run = run_matrix(args.matrix, args.only, specs, out_dir, args.workers, cache, args.offline,
                             args.max_cases, progress=progress, case_timeout=args.case_timeout,
                             fork_config=args.fork_config, regressions_of=patched_regressions(specs, assessed),
                             max_rss=args.max_rss)
        except (Interrupted, KeyboardInterrupt):
            progress.close()
            print(f"repro: interrupted; partial results kept in {out_dir / 'results.jsonl'}", file=sys.stderr)
            return 130
        progress.close()
        run["started_at"] = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
        run["elapsed_s"] = round(time.time() - started, 1)
        upstream = _upstream_tests(args) if args.upstream_tests else None
        found = review(run, args.base, args.head, assessed, args.accept_lost_coverage, upstream)
        run["review"] = verdict_of(found)  # the run's own reports carry the review's verdict
        run["summary"] = summarize(run)
        rundir.write_atomic(out_dir / "run.json", rundir.run_text(run))
        write_all_formats(run, out_dir)
        found["bisect"] = review_bisect.offers_for(run, args, out_dir)  # repro bisect per changed signature
        rundir.write_atomic(out_dir / "review.json", json.dumps(found, indent=1))
        relative = {"report.md": "report.md", "report.html": "report.html", "junit.xml": "junit.xml",
                    "review.json": "review.json"}
        text = render_review(found, relative, _ops_changes(prepared, args.base, args.head),
                             review_bisect.render_offers(found["bisect"]))
        rundir.write_atomic(out_dir / "review.md", text)
    sys.stdout.write(text)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(found, run):
            print(line)
    print(terminal_line(found, str(out_dir / "review.md")))
    return int(found["exit_code"])  # the decision's, as every output says it


def _upstream_tests(args: argparse.Namespace) -> dict[str, Any]:
    """Upstream's own fuser tests: base's on base, head's on head (repro upstream-tests), compared."""
    from repro.upstream_command import run_upstream_tests, tests_of

    runs = {}
    for side, spec in (("base", args.base), ("head", args.head)):
        print(f"repro review: upstream's fuser tests on {side} ({spec})", file=sys.stderr)
        with tests_of(spec) as tests:
            runs[side] = run_upstream_tests(spec, tests, None, ["-n", str(args.workers)], args.cache_dir, args.offline)
    return upstream_diff.section(runs["base"], runs["head"])


def _ops_changes(prepared: dict[str, Any], base: str, head: str) -> dict[str, Any] | None:
    """What the sync changed in ops/, when base and head are revisions of one repository."""
    revisions = [(prepared[spec].provenance or {}).get("revision", "") for spec in (base, head)]
    directories = {r.rpartition("@")[0] for r in revisions}
    if not all(revisions) or len(directories) != 1:
        return None
    commits = [prepared[spec].provenance["git_commit"] for spec in (base, head)]
    return ops_changes(Path(directories.pop()), commits[0], commits[1])


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:

    from cases.matrix import MAX_CASES_DEFAULT
    from harness.megatron.source import DEFAULT_VERSION

    p = sub.add_parser("review", parents=[common],
                       help="review an upstream sync: run the matrix on the base and head trees (and with the"
                            " patches that apply) and answer per regression; exit 1 on a regression at head",
                       epilog="example: repro review --base path:../fork@HEAD~1 --head path:../fork@HEAD")
    p.add_argument("--base", required=True, metavar="SPEC",
                   help="the tree before the sync: path:DIR, path:DIR@REV (a git revision, exported into the cache"
                        " with git archive; the work tree and index are never touched) or te-<x.y.z>")
    p.add_argument("--head", required=True, metavar="SPEC", help="the tree after the sync, in the same forms")
    p.add_argument("--matrix", default="all", help=f"what to run: {', '.join(matrix_names())} (default all: the"
                   " whole catalogue)")
    p.add_argument("--only", action="append", metavar="AXIS=V[,V]", help="keep only these axis values")
    p.add_argument("--max-cases", type=validate.positive_int, default=MAX_CASES_DEFAULT,
                   help="refuse larger selections")
    p.add_argument("--fork-config", metavar="FILE", help="a fork's TOML config for both trees (default: each tree's"
                   " own .te-repro.toml)")
    p.add_argument("--out", help="run dir (default runs/review): the run's reports, review.md and review.json")
    p.add_argument("-n", "--workers", type=validate.worker_count, default=min(2, validate.usable_cpus()),
                   help="xdist workers per target (1 or more)")
    p.add_argument("--case-timeout", type=validate.timeout_seconds, default=CASE_TIMEOUT_S,
                   help="seconds (above 0) before a case is recorded as hung")
    p.add_argument("--max-rss", type=validate.max_rss_bytes, metavar="GIB",
                   help="memory (GiB) each worker may hold; a case over it is recorded as over the bound "
                   "(default: 80%% of the machine's memory over the workers)")
    p.add_argument("--megatron", metavar="VERSION|path:DIR",
                   help=f"the megatron-core the Megatron cases import (default {DEFAULT_VERSION})")
    p.add_argument("--accept-lost-coverage", action="store_true",
                   help="cases that ran at base and not at head (stopped running) do not fail the review")
    p.add_argument("--bisect", action="store_true", help="when base and head are revisions of one repository: run"
                   " repro bisect for each changed signature and name its commit in review.md")
    p.add_argument("--upstream-tests", action="store_true",
                   help="also run each tree's own tests/pytorch/test_fusible_ops.py on it (both must be path: trees)"
                        " and list the tests whose result changed; a test that fails at head and did not at base"
                        " fails the review, unless it fails on what the CPU backend lacks")
    p.set_defaults(func=cmd_review)
