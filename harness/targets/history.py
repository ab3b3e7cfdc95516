"""What a sync changed in the fuser's package between two commits of one repository: the diff
stat of `transformer_engine/pytorch/ops/` and the commits that touched it. Git runs read-only,
with the repository's own commands off (no fsmonitor, hooks, external diff or textconv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

OPS = "transformer_engine/pytorch/ops"
COMMITS_LISTED = 30
SAFE = ("-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "diff.external=", "-c", "log.showSignature=false")


def _git(directory: Path, *args: str) -> str | None:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_EXTERNAL_DIFF": "", "GIT_PAGER": "cat"}
    try:
        done = subprocess.run(["git", *SAFE, "-C", str(directory), *args], capture_output=True, text=True,
                              check=False, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def ops_changes(directory: Path, base: str, head: str) -> dict[str, object] | None:
    """{"stat": [lines], "commits": ["sha subject", ...], "more": N} between two commits, or None
    where git cannot say (not a repository, unknown commits)."""
    stat = _git(directory, "diff", "--no-ext-diff", "--no-textconv", "--stat=100", f"{base}..{head}", "--", OPS)
    log = _git(directory, "log", "--no-decorate", "--format=%h %s", f"{base}..{head}", "--", OPS)
    if stat is None or log is None:
        return None
    commits = log.splitlines()
    return {"stat": stat.rstrip().splitlines(), "commits": commits[:COMMITS_LISTED],
            "more": max(0, len(commits) - COMMITS_LISTED)}
