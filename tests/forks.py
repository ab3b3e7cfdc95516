"""The upstream-sync scenario, built in a test from the cached release trees with real git:
te-2.13.0's tree as upstream before PR #2919, te-2.16.0's fuser.py (and the quantized_tensor.py
it imports from) as upstream's fix, the
fork as upstream plus patches/backport.patch committed, and the sync as a merge of
upstream's fix into the fork, which conflicts in fuser.py."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness import targets
from harness.targets import sources
from tests.conftest import REPO

FUSER = sources.FUSER_RELPATH
QUANTIZED_TENSOR = Path("transformer_engine/pytorch/quantized_tensor.py")
EXPECT_FIXED = '[expect]\nissue22 = "fixed"\n'


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "PATH": "/usr/bin:/bin"}
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=False)
    if result.returncode not in (0, 1) or (result.returncode == 1 and args[0] != "merge"):
        raise AssertionError(f"git {' '.join(args)}: {result.stdout}{result.stderr}")
    return result.stdout.strip()


@dataclass
class Fork:
    repo: Path
    upstream_base: str  # upstream before the fix (te-2.13.0's tree, version 2.16.0.dev0)
    upstream_fix: str  # upstream's fix: te-2.16.0's fuser.py
    fork_base: str  # the fork before the sync: upstream_base + the backport
    synced: str  # the fork after merging upstream_fix, the conflict resolved with upstream's fuser.py
    lost_fix: str  # the same merge resolved with the pre-fix fuser.py: the fix is lost
    merge_output: str  # what git said when the merge conflicted

    def spec(self, commit: str) -> str:
        return f"path:{self.repo}@{commit}"


def build_fork(root: Path, cache: Path, declare_fixed: bool = True) -> Fork:
    old = Path(targets.prepare("te-2.13.0", cache).root)
    new = Path(targets.prepare("te-2.16.0", cache).root)
    repo = root / "fork"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "upstream")
    shutil.copytree(old / "transformer_engine", repo / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "build_tools").mkdir()
    (repo / "build_tools/VERSION.txt").write_text("2.16.0.dev0\n")  # every commit between 2.15 and 2.16
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "upstream before #2919")
    upstream_base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "fork")
    git(repo, "apply", str(REPO / "patches/backport.patch"))
    if declare_fixed:
        (repo / ".te-repro.toml").write_text(EXPECT_FIXED)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "backport issue22")
    fork_base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "upstream")
    # Upstream's fix as 2.16.0 ships it: its fuser.py, and the quantized_tensor.py whose
    # restore_from_func_ctx that fuser.py imports (the whole package runs as shipped).
    for relpath in (FUSER, QUANTIZED_TENSOR):
        shutil.copy(new / relpath, repo / relpath)
    git(repo, "commit", "-q", "-am", "guard fuser grad checks on non-leaf nodes (#2919)")
    upstream_fix = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "fork")
    merge_output = git(repo, "merge", "--no-edit", "upstream")
    assert "CONFLICT" in merge_output and "fuser.py" in merge_output, merge_output
    git(repo, "checkout", "--theirs", "--", str(FUSER))  # resolved with upstream's file
    git(repo, "add", str(FUSER))
    git(repo, "commit", "-q", "--no-edit")
    synced = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "lost-fix", fork_base)
    git(repo, "merge", "--no-edit", "upstream")
    git(repo, "show", f"{upstream_base}:{FUSER}")
    (repo / FUSER).write_text(git(repo, "show", f"{upstream_base}:{FUSER}") + "\n")  # neither side's fix kept
    git(repo, "add", str(FUSER))
    git(repo, "commit", "-q", "--no-edit")
    lost_fix = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "fork")
    return Fork(repo, upstream_base, upstream_fix, fork_base, synced, lost_fix, merge_output)
