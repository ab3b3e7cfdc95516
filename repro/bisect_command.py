"""`repro bisect`: the upstream commit at which chosen cases changed from their state at a
good revision to their state at a bad one (the fix a backport can be dropped for, or the
commit that broke a case). Each judged commit is one ordinary run (a `path:DIR@COMMIT`
target, exported into the cache with git archive) in a run dir of its own under --out; the
search itself is `harness.runner.bisect`."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cases.matrix import MAX_CASES_DEFAULT, generate, matrix_names, selections_of
from harness import targets
from harness.errors import TargetLoadError, UsageError
from harness.runner import bisect, rundir
from harness.runner.sessions import CASE_TIMEOUT_S, LOAD_TIMEOUT_S, Interrupted, run_matrix
from harness.targets import history, revisions, sources
from repro import rerun, validate
from repro.bisect_render import render
from repro.formats import check_step_summary, write_all_formats
from repro.reports import summarize
from repro.run_commands import megatron_env, megatron_for_run

FORMATS = ("text", "md", "json")
EXAMPLE = ("repro bisect --good path:../TransformerEngine@v2.15 --bad path:../TransformerEngine@v2.16"
           " --matrix issue22 --only pipeline=fused_residual_rmsnorm")


def _end(option: str, spec: str, repo: str | None) -> tuple[Path, str]:
    """(repository dir, revision) of `--good`/`--bad`: path:DIR@REV, or te-X.Y.Z with --repo DIR."""
    parsed = targets.parse_spec(spec)
    if parsed.patch:
        raise UsageError(f"{option} {spec}: bisect the tree without +{parsed.patch}")
    if parsed.kind == "wheel":
        if repo is None:
            raise UsageError(f"{option} {spec}: a release needs --repo DIR (a TE git checkout whose tags name it),"
                             " or give path:DIR@REV")
        directory = Path(repo).expanduser().resolve()
        if not directory.is_dir():
            raise UsageError(f"--repo {repo}: not a directory")
        return directory, history.tag_for_version(directory, parsed.value)
    directory_text, rev = revisions.split(parsed.value) if parsed.kind == "path" else ("", None)
    if rev is None:
        raise UsageError(f"{option} {spec}: give a git revision of a TE checkout (path:DIR@REV) or a release"
                         " (te-X.Y.Z with --repo DIR)")
    directory = Path(directory_text).expanduser().resolve()
    if repo is not None and history.repository(directory) != history.repository(Path(repo).expanduser().resolve()):
        raise UsageError(f"{option} {spec} is not a revision of --repo {repo}")
    return directory, rev


def _selections(args: argparse.Namespace) -> tuple[str, list]:
    if bool(args.case) == bool(args.matrix):
        raise UsageError("give the cases to bisect: --case ID (repeatable) or --matrix M [--only AXIS=V]")
    if args.case:
        if args.only:
            raise UsageError("--only narrows a --matrix; --case names its cases: drop --only")
        return "bisect", selections_of(rerun.parse_case_ids(args.case))
    validate.check_only(args.only)
    return args.matrix, generate(args.matrix, args.only, args.max_cases)


@contextlib.contextmanager
def _no_step_summary() -> Iterator[None]:
    """A step's run is no CI run: its summary is not appended to $GITHUB_STEP_SUMMARY."""
    saved = os.environ.pop("GITHUB_STEP_SUMMARY", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["GITHUB_STEP_SUMMARY"] = saved


def _chosen(args: argparse.Namespace) -> list[str]:
    return [x for case in args.case for x in ("--case", case)] if args.case else [
        "--matrix", args.matrix, *(x for only in args.only or [] for x in ("--only", only))]


def reproduce_command(args: argparse.Namespace, spec: str) -> str:
    """The `repro run` that shows one side of the answer."""
    return shlex.join(["repro", "run", *_chosen(args), "--targets", spec])


class Steps:
    """The judge: each commit one run, in its own run dir under the bisect's --out."""

    def __init__(self, args: argparse.Namespace, directory: Path, matrix: str, selections: list, out_dir: Path,
                 cache: Path) -> None:
        self.args, self.directory, self.matrix, self.selections = args, directory, matrix, selections
        self.out_dir, self.cache = out_dir, cache
        self.run_dirs: dict[str, str] = {}
        self.count = 0

    def spec(self, commit: str) -> str:
        return f"path:{self.directory}@{commit}"

    def judge(self, commit: str) -> bisect.Judged | None:
        self.count += 1
        step_dir = self.out_dir / f"step-{self.count:02d}-{commit[:12]}"
        self.run_dirs[commit] = str(step_dir)
        started = time.time()
        try:
            with rundir.claim(step_dir), _no_step_summary():
                run = run_matrix(self.matrix, self.args.only, [self.spec(commit)], step_dir, self.args.workers,
                                 self.cache, self.args.offline, self.args.max_cases, progress=lambda _: None,
                                 case_timeout=self.args.case_timeout, load_timeout=self.args.load_timeout,
                                 selections=self.selections)
                run["started_at"] = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
                run["elapsed_s"] = round(time.time() - started, 1)
                run["summary"] = summarize(run)
                rundir.write_atomic(step_dir / "run.json", rundir.run_text(run))
                write_all_formats(run, step_dir)
        except (TargetLoadError, UsageError) as exc:  # a commit whose tree cannot be prepared: skipped
            print(f"repro bisect: {commit[:12]}: {' '.join(str(exc).split())}", file=sys.stderr)
            return None
        return bisect.signatures(run["results"]) if run["results"] else None


def _print_step(directory: Path, number: int, step: bisect.Step) -> None:
    subject = history.commit_info(directory, step.commit).subject
    said = f"{step.state} ({step.why})" if step.why else step.state
    print(f"repro bisect: [{number}] {step.role} {step.commit[:12]} {subject[:60]!r}: {said}", file=sys.stderr,
          flush=True)


def _info(directory: Path, commit: str, github: str | None) -> dict[str, Any]:
    return asdict(history.commit_info(directory, commit, github))


def answer_of(args: argparse.Namespace, steps: Steps, found: bisect.Answer | None, reason: str,
              step_list: list[bisect.Step], ends: dict[str, Any]) -> dict[str, Any]:
    """The answer as data (bisect.json)."""
    result: dict[str, Any] = {"schema": "repro.bisect/1", **ends, "status": "no answer", "reason": reason,
                              "steps": [{**asdict(s), "run_dir": steps.run_dirs.get(s.commit)} for s in step_list],
                              "judged": steps.count}
    if found is None:
        return result
    candidates = [_info(steps.directory, c, args.github) for c in found.culprits]
    before, after = (found.last_good, found.culprits[-1])
    result.update({
        "status": "found" if found.exact else f"one of {len(found.culprits)} commits", "reason": "",
        "commit": candidates[0] if found.exact else None, "candidates": candidates, "last_good": before,
        "before": bisect.describe(found.before), "after": bisect.describe(found.after),
        "bad_end": bisect.describe(found.bad_state), "after_is_bad_end": found.after == found.bad_state,
        "changed_cases": bisect.changed_cases(found.before, found.after), "cases": len(found.cases),
        "dropped_cases": found.dropped,
        "reproduce": {"before": reproduce_command(args, steps.spec(before[:12])),
                      "after": reproduce_command(args, steps.spec(after[:12]))}})
    if found.after != found.bad_state:  # the cases changed again later: the bisect that finds the next change
        bad = steps.spec(found.bad_commit[:12])
        result["next"] = shlex.join(["repro", "bisect", "--good", steps.spec(after[:12]), "--bad", bad,
                                     *_chosen(args)])
    return result


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        raise UsageError(f"--format {args.format!r}: valid: {', '.join(FORMATS)}")
    if args.github is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+", args.github):
        raise UsageError(f"--github {args.github!r}: give OWNER/NAME, e.g. NVIDIA/TransformerEngine")
    matrix, selections = _selections(args)
    good_dir, good_rev = _end("--good", args.good, args.repo)
    bad_dir, bad_rev = _end("--bad", args.bad, args.repo)
    if history.repository(good_dir) != history.repository(bad_dir):
        raise UsageError(f"--good {args.good} and --bad {args.bad} are not revisions of one repository")
    good, bad = history.resolve(good_dir, good_rev), history.resolve(good_dir, bad_rev)
    if good == bad:
        raise UsageError(f"--good and --bad are both commit {good[:12]}; give two revisions")
    out_dir = Path(os.path.abspath(args.out or Path("runs") / "bisect"))
    cache = sources.cache_dir(args.cache_dir)
    validate.check_out(out_dir, [f"path:{good_dir}"], cache)
    check_step_summary(out_dir)  # each step's reports append to it
    rundir.check_run_dir(out_dir)
    for name in ("bisect.json", "bisect.md"):
        rundir.check_regular_output(out_dir / name, "--out")
    base = None if history.is_ancestor(good_dir, good, bad) else history.merge_base(good_dir, good, bad)
    commits = history.commits_between(good_dir, base or good, bad, args.first_parent)
    if not commits or commits[-1] != bad:
        raise UsageError(f"--bad {args.bad} is not reached from the good end along"
                         f" {'the first-parent chain' if args.first_parent else 'the history'}; drop --first-parent")
    ends = {"good": args.good, "bad": args.bad, "good_commit": good, "bad_commit": bad, "repository": str(good_dir),
            "first_parent": args.first_parent, "merge_base": base, "commits_between": len(commits)}
    megatron = megatron_for_run(None, selections, out_dir, cache, args.offline)
    started = time.time()
    with rundir.claim(out_dir), megatron_env(megatron):
        for name in ("bisect.json", "bisect.md"):  # an earlier bisect's answer, never left beside this one's steps
            (out_dir / name).unlink(missing_ok=True)
        steps = Steps(args, good_dir, matrix, selections, out_dir, cache)
        shown: list[bisect.Step] = []
        after = f"their merge base {base[:12]} (the good end is not an ancestor of the bad end)" if base else \
            "the good end"
        print(f"repro bisect: {len(commits)} commits after {after}; about {math.ceil(math.log2(len(commits) + 1))}"
              " steps besides the ends", file=sys.stderr, flush=True)

        def on_step(step: bisect.Step) -> None:
            shown.append(step)
            _print_step(good_dir, len(shown), step)

        try:
            found: bisect.Answer | None = bisect.bisect(good, commits, steps.judge, base, on_step)
            reason = ""
        except bisect.NoAnswer as exc:
            found, reason = None, str(exc)
        except (Interrupted, KeyboardInterrupt):
            print(f"repro: interrupted; the runs of the {len(shown)} judged commits are kept in {out_dir}",
                  file=sys.stderr)
            return 130
        answer = answer_of(args, steps, found, reason, shown, ends)
        answer["wall_s"] = round(time.time() - started, 1)
        rundir.write_atomic(out_dir / "bisect.json", json.dumps(answer, indent=1))
        rundir.write_atomic(out_dir / "bisect.md", render(answer, "md"))
    sys.stdout.write(json.dumps(answer, indent=1) + "\n" if args.format == "json" else render(answer, args.format))
    return 0 if found is not None else 1


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bisect", parents=[common], epilog=f"example: {EXAMPLE}",
                       help="name the upstream commit at which cases changed from their state at --good to their"
                            " state at --bad (a fix, or what broke them); each step is a run dir under --out")
    p.add_argument("--good", required=True, metavar="SPEC",
                   help="the older end: path:DIR@REV (a git revision; exported with git archive, the work tree,"
                        " index and HEAD are never touched) or te-X.Y.Z with --repo")
    p.add_argument("--bad", required=True, metavar="SPEC", help="the newer end, in the same forms, same repository")
    p.add_argument("--repo", metavar="DIR", help="the TE git checkout whose tags name --good/--bad releases")
    p.add_argument("--case", action="append", metavar="ID", help="a case id to bisect (repeatable)")
    p.add_argument("--matrix", help=f"or the cases of a matrix: {', '.join(matrix_names())}")
    p.add_argument("--only", action="append", metavar="AXIS=V[,V]", help="with --matrix: keep only these values")
    p.add_argument("--max-cases", type=validate.positive_int, default=MAX_CASES_DEFAULT,
                   help="refuse larger selections")
    p.add_argument("--first-parent", action="store_true",
                   help="walk only the first-parent chain from --good to --bad (a merge is one step)")
    p.add_argument("--out", help="dir of the bisect (default runs/bisect): bisect.json, bisect.md and one run dir"
                   " per judged commit (step-NN-COMMIT)")
    p.add_argument("--github", metavar="OWNER/NAME", help="link pull requests on this GitHub repository (default:"
                   " the checkout's origin when it is on GitHub; e.g. NVIDIA/TransformerEngine)")
    p.add_argument("--format", default="text", help=f"the answer on stdout: {', '.join(FORMATS)}")
    p.add_argument("-n", "--workers", type=validate.worker_count, default=1, help="xdist workers per step's run")
    p.add_argument("--case-timeout", type=validate.timeout_seconds, default=CASE_TIMEOUT_S,
                   help="seconds (above 0) before a case is recorded as hung")
    p.add_argument("--load-timeout", type=validate.timeout_seconds, default=LOAD_TIMEOUT_S,
                   help="seconds (above 0) a worker may take to load a commit's tree")
    p.set_defaults(func=cmd_bisect)
