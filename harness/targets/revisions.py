"""`path:DIR@REV`: a git revision of a source tree, exported into the cache as the commit's exact
blobs (`safegit`: no filters, attributes or other commands of the repository's own), so the
user's work tree, index and HEAD are never touched (no checkout, no worktree)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.errors import UsageError
from harness.targets import safegit, sources

# What a target needs from a commit: TE's package, its version file and the fork config.
EXPORTED = ("transformer_engine", "build_tools", "VERSION.txt", ".te-repro.toml")


def split(value: str) -> tuple[str, str | None]:
    """`DIR@REV` -> (DIR, REV) when DIR is a directory and `DIR@REV` itself is not; else (value, None)."""
    head, sep, rev = value.rpartition("@")
    if not sep or not head or not rev or Path(value).expanduser().exists():
        return value, None
    return head, rev


def git(directory: Path, *args: str) -> subprocess.CompletedProcess:
    """A read-only git command in `directory` (text output), as every revision look-up runs it."""
    return safegit.run(directory, *args)


def commit_of(directory: Path, rev: str) -> str:
    """The commit `rev` names in the git repository holding `directory` (UsageError when none)."""
    return _commit(directory.expanduser().resolve(), rev)[0]


def _commit(directory: Path, rev: str) -> tuple[str, str]:
    """(commit, tree-ish of `directory` at it) for `rev` in the git repository holding `directory`."""
    if not directory.is_dir():
        raise UsageError(f"path:{directory}@{rev}: {directory} is not a directory")
    commit = git(directory, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if commit.returncode != 0:
        raise UsageError(f"path:{directory}@{rev}: {rev!r} is not a commit of the git repository at {directory}"
                         " (give a branch, tag or commit, e.g. path:DIR@HEAD~1)")
    sha = commit.stdout.strip()
    prefix = git(directory, "rev-parse", "--show-prefix").stdout.strip().rstrip("/")
    return sha, (f"{sha}:{prefix}" if prefix else sha)


def _extract(directory: Path, rev: str, tree_ish: str, names: list[str], dest: Path) -> None:
    safegit.export_blobs(directory, tree_ish, names, dest, f"path:{directory}@{rev}")


def export_path(directory: Path, rev: str, name: str, dest: Path) -> Path:
    """One path of `directory` at `rev` (e.g. `tests/pytorch`), extracted under `dest`; returns it there."""
    directory = directory.expanduser().resolve()
    sha, tree_ish = _commit(directory, rev)
    if git(directory, "cat-file", "-e", safegit.inside(tree_ish, name)).returncode:
        raise UsageError(f"path:{directory}@{rev}: commit {sha[:12]} has no {name}")
    _extract(directory, rev, tree_ish, [name], dest)
    return dest / name


def _intact(final: Path, directory: Path, tree_ish: str, names: list[str]) -> bool:
    """The cached export holds exactly `names`, each hashing to the commit's own tree or blob."""
    if not final.is_dir() or sorted(p.name for p in final.iterdir()) != sorted(names):
        return False
    expected = git(directory, "rev-parse", *(safegit.inside(tree_ish, n) for n in names)).stdout.split()
    if len(expected) != len(names):
        return False
    try:
        return expected == [safegit.tree_hash(final / name, like=expected[0]) for name in names]
    except (OSError, UsageError):
        return False


def export(directory: Path, rev: str, cache: Path) -> tuple[Path, dict[str, str]]:
    """The tree of `rev` in the git repository holding `directory`, under cache/revisions/
    (once per commit), and its provenance: commit, the name given, clean (a commit has no
    uncommitted changes), and where it came from."""
    directory = directory.expanduser().resolve()
    sha, tree_ish = _commit(directory, rev)
    prefix = tree_ish.partition(":")[2]
    final = cache / "revisions" / f"{sha[:16]}-{sources.short_hash(prefix.encode())}"
    provenance = {"git_commit": sha, "git_branch": rev, "git_state": "clean", "revision": f"{directory}@{rev}"}
    listed = git(directory, "ls-tree", "--name-only", tree_ish).stdout.split()
    wanted = [name for name in EXPORTED if name in listed]
    if "transformer_engine" not in wanted:
        raise UsageError(f"path:{directory}@{rev}: commit {sha[:12]} has no transformer_engine/ there")
    if _intact(final, directory, tree_ish, wanted):
        return final, provenance
    with sources.file_lock(cache / "locks" / f"revision-{final.name}.lock"):
        if _intact(final, directory, tree_ish, wanted):
            return final, provenance
        if final.exists():
            shutil.rmtree(final)  # changed in the cache: exported again
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}-") as tmp:
            staged = Path(tmp) / "tree"
            _extract(directory, rev, tree_ish, wanted, staged)
            if not (staged / sources.FUSER_RELPATH).is_file():  # named by its spec, not the cache's staging folder
                raise UsageError(f"path:{directory}@{rev}: commit {sha[:12]} has no {sources.FUSER_RELPATH}: it"
                                 " predates TE's op fuser (te.ops), so no regression of the catalogue applies to it")
            staged.rename(final)
    return final, provenance
