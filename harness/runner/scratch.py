"""A run's temporary files stay in its run dir: the processes it starts get a scratch folder there as
their TMPDIR, and torch's compile cache folder with it, removed once they have ended.

Without it every run left folders in the machine's /tmp: each pytest session its basetemp
(pytest-of-USER), and each process that imports torch._dynamo (torch.utils.checkpoint does, for
the recompute cases; the run's judge too) torch's cache folder, torchinductor_USER.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = ".scratch-"
INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


@contextmanager
def scratch(run_dir: Path) -> Iterator[dict[str, str]]:
    """The environment for the processes a run starts, with a scratch folder in `run_dir`; this
    process's own torch cache folder points there too while the block runs. A torch cache folder
    the user named stays theirs."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=run_dir))
    users = os.environ.get(INDUCTOR_CACHE)
    env = {"TMPDIR": str(folder), INDUCTOR_CACHE: users or str(folder / "torch")}
    os.environ[INDUCTOR_CACHE] = env[INDUCTOR_CACHE]  # torch._dynamo's import makes it, in the judge as well
    try:
        yield env
    finally:
        if users is None:
            os.environ.pop(INDUCTOR_CACHE, None)
        else:
            os.environ[INDUCTOR_CACHE] = users
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def temporary() -> Iterator[dict[str, str]]:
    """For a command without a run dir (probing a target, Megatron's minimal scenario, listing a target's
    ops): the same environment, its folder in a temporary directory removed with it."""
    with tempfile.TemporaryDirectory(prefix="repro-scratch-") as folder, scratch(Path(folder)) as env:
        yield env


def remove_left(run_dir: Path) -> None:
    """The scratch folders of an earlier run into `run_dir` that was killed before it could remove them."""
    for entry in run_dir.glob(f"{PREFIX}*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
