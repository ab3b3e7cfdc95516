"""A run's processes die with it: `repro run` killed in any way (SIGKILL included) takes
its pytest sessions and their xdist workers with it.

Each session starts in its own process group under harness.runner.reaper (a child
subreaper that kills every process the session left, setsid'd ones too, when the session
ends or `repro run` dies), with the parent-death signal set (PR_SET_PDEATHSIG, Linux), and
loads this module as a pytest plugin, so every xdist worker sets it too: the kernel kills
the session when `repro run` dies, and each worker when its session dies. `PARENT_ENV` names the pid each process expects as its parent, so
a process whose parent died before the signal was armed exits at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reaper and `repro` import this module too, and start faster without pytest
    import pytest

PR_SET_PDEATHSIG = 1
PARENT_ENV = "REPRO_EXPECTED_PARENT"
# Looked up once, here: the pre-exec hook runs between fork and exec, where loading a
# library is not safe.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(expected_parent: int | None = None) -> None:
    """Arm SIGKILL-on-parent-death for this process (no-op off Linux); exit at once when
    the parent (`expected_parent`, else $REPRO_EXPECTED_PARENT) is already gone."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    die_with_parent_check(expected_parent)


def die_with_parent_check(expected_parent: int | None = None) -> None:
    """Exit at once when the parent this process expects is already gone (it died before the
    parent-death signal was armed)."""
    expected = str(expected_parent) if expected_parent else os.environ.get(PARENT_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        os._exit(1)  # the parent is already gone


def session_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a session started by this process: the expected parent, and
    no bytecode written (a session imports a target, which may be a user's own tree)."""
    return {**env, PARENT_ENV: str(os.getpid()), "PYTHONDONTWRITEBYTECODE": "1"}


def pytest_configure(config: pytest.Config) -> None:
    die_with_parent()
    os.environ[PARENT_ENV] = str(os.getpid())  # the xdist workers this process starts expect it
