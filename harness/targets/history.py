"""Reading a TE checkout's history for `repro bisect`: the commits between two revisions,
their merge base, a commit's subject, pull request and files, the tag of a release, and the
merges on a first-parent line that brought in another history (a fork's upstream sync).
Read only, through the same git calls as `path:DIR@REV` (`revisions.git`): nothing here
checks out, refreshes the index or runs the repository's hooks, filters or diff drivers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.targets import revisions

PR_IN_SUBJECT = (re.compile(r"\(#(\d+)\)\s*$"), re.compile(r"^Merge pull request #(\d+)\b"))
GITHUB_REMOTE = re.compile(r"github\.com[:/]+([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def _out(directory: Path, *args: str) -> str:
    done = revisions.git(directory, *args)
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} in {directory}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def resolve(directory: Path, rev: str) -> str:
    """The commit `rev` names in the repository holding `directory` (UsageError when none)."""
    return revisions.commit_of(directory, rev)


def repository(directory: Path) -> str:
    """The repository's common git dir: two checkouts (worktrees) of one repository share it."""
    return str((directory / _out(directory, "rev-parse", "--git-common-dir")).resolve())


def is_ancestor(directory: Path, older: str, newer: str) -> bool:
    return revisions.git(directory, "merge-base", "--is-ancestor", older, newer).returncode == 0


def merge_base(directory: Path, a: str, b: str) -> str:
    return _out(directory, "merge-base", a, b)


def commits_between(directory: Path, good: str, bad: str, first_parent: bool = False) -> list[str]:
    """The commits after `good` up to `bad`, oldest first (the first-parent chain with `first_parent`)."""
    walk = ["--first-parent"] if first_parent else ["--ancestry-path"]
    return _out(directory, "rev-list", "--reverse", "--topo-order", *walk, f"{good}..{bad}").split()


def tag_for_version(directory: Path, version: str) -> str:
    """The tag of release `version` (2.16.0: v2.16.0, then v2.16, then 2.16.0)."""
    tried = [f"v{version}", f"v{version.removesuffix('.0')}" if version.count(".") == 2 else "", version]
    for tag in dict.fromkeys(t for t in tried if t):
        if revisions.git(directory, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}").returncode == 0:
            return tag
    raise UsageError(f"release {version}: {directory} has no tag {' or '.join(t for t in tried if t)}"
                     " (give path:DIR@REV instead)")


# A tag usable inside a spec (path:DIR@TAG): no `@` (the spec's separator) and no `+` (a patch).
SPEC_SAFE_TAG = re.compile(r"[A-Za-z0-9._/-]+")


def readable(directory: Path, commit: str) -> str:
    """A name for `commit` in an offered command: a tag pointing at it, else its 12-hex id."""
    listed = revisions.git(directory, "for-each-ref", f"--points-at={commit}", "--format=%(refname:short)",
                           "refs/tags")
    tags = sorted(t for t in listed.stdout.split() if SPEC_SAFE_TAG.fullmatch(t)) if listed.returncode == 0 else []
    for name in [*tags, commit[:12]]:
        # a tag could also name a branch, and a short id could grow ambiguous: keep only a name that resolves back
        done = revisions.git(directory, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
        if done.returncode == 0 and done.stdout.strip() == commit:
            return name
    return commit


@dataclass(frozen=True)
class Merge:
    """A merge on head's first-parent line whose other parent brought commits that are not the base's
    descendants (another history: an upstream the fork syncs with)."""

    commit: str
    subject: str
    merged: str  # the parent it merged: the tip of the history it brought in (an upstream tag)
    merge_base: str  # of the base and `merged`: the last commit of that history the base already had
    brought: int  # commits of that history the base did not have


def merges_since(directory: Path, base: str, head: str) -> list[Merge]:
    """The merges on head's first-parent line after `base` that brought in commits a bisect of
    base..head cannot reach (not descendants of base: an upstream tag's history), the largest
    first. A merged side contained in another's is left out: bisecting the larger one walks it."""
    found: list[Merge] = []
    for line in _out(directory, "rev-list", "--first-parent", "--parents", f"{base}..{head}").splitlines():
        commit, first, *others = line.split()
        for merged in others:
            if is_ancestor(directory, merged, base) or is_ancestor(directory, merged, first):
                continue  # nothing new: the base, or this line before the merge, had it already
            if is_ancestor(directory, base, merged):
                continue  # a branch started from base: `--ancestry-path base..head` walks its commits already
            done = revisions.git(directory, "merge-base", base, merged)
            if done.returncode != 0:
                continue  # unrelated histories: no commit to start a bisect from
            brought = int(_out(directory, "rev-list", "--count", f"{base}..{merged}"))
            subject = _out(directory, "log", "-1", "--no-show-signature", "--format=%s", commit)
            found.append(Merge(commit, subject, merged, done.stdout.strip(), brought))
    kept = [m for m in found if not any(o.merged != m.merged and is_ancestor(directory, m.merged, o.merged)
                                        for o in found)]
    return sorted(kept, key=lambda m: -m.brought)  # stable: the newest first among equals


@dataclass(frozen=True)
class CommitInfo:
    commit: str
    parent: str | None  # the first parent
    subject: str
    pr: int | None
    pr_link: str | None  # on GitHub, when the repository's origin is there
    files: list[str]  # changed under transformer_engine/, against the first parent


def pr_number(subject: str) -> int | None:
    for pattern in PR_IN_SUBJECT:
        if match := pattern.search(subject):
            return int(match.group(1))
    return None


def github_repo(directory: Path) -> str | None:
    """`OWNER/NAME` when the repository's origin is on GitHub."""
    done = revisions.git(directory, "config", "--get", "remote.origin.url")
    match = GITHUB_REMOTE.search(done.stdout.strip()) if done.returncode == 0 else None
    return f"{match.group(1)}/{match.group(2)}" if match else None


def commit_info(directory: Path, commit: str, github: str | None = None) -> CommitInfo:
    """A commit's subject, first parent, pull request (linked on `github`, OWNER/NAME, else on the
    origin's GitHub repository) and the files it changed under transformer_engine/."""
    subject = _out(directory, "log", "-1", "--no-show-signature", "--format=%s", commit)
    parents = _out(directory, "log", "-1", "--format=%P", commit).split()
    parent = parents[0] if parents else None
    diff = ["diff-tree", "-r", "--no-commit-id", "--name-only", "--no-renames", "--no-ext-diff", "--no-textconv", "--relative"]
    files = _out(directory, *diff, *((parent, commit) if parent else ("--root", commit)), "--",
                 "transformer_engine").splitlines()
    pr = pr_number(subject)
    repo = (github or github_repo(directory)) if pr is not None else None
    return CommitInfo(commit, parent, subject, pr, f"https://github.com/{repo}/pull/{pr}" if repo else None,
                      [f for f in files if f])


OPS = "transformer_engine/pytorch/ops"
COMMITS_LISTED = 30


def ops_changes(directory: Path, base: str, head: str) -> dict[str, object] | None:
    """What a sync changed in the fuser's package between two commits: {"stat": [lines],
    "commits": ["sha subject", ...], "more": N}, or None where git cannot say."""
    stat = revisions.git(directory, "diff", "--no-ext-diff", "--no-textconv", "--stat=100", f"{base}..{head}", "--", OPS)
    log = revisions.git(directory, "log", "--no-decorate", "--no-show-signature", "--format=%h %s", f"{base}..{head}",
                        "--", OPS)
    if stat.returncode or log.returncode:
        return None
    commits = log.stdout.splitlines()
    return {"stat": stat.stdout.rstrip().splitlines(), "commits": commits[:COMMITS_LISTED],
            "more": max(0, len(commits) - COMMITS_LISTED)}
