"""`python -m harness.runner.reaper [--pass-fd N] -- COMMAND ...`: run a target's pytest session so that
every process a case starts ends with the session, also one that left the session's
process group (setsid, a daemon's double fork).

This process is a child subreaper (Linux PR_SET_CHILD_SUBREAPER): an orphaned descendant
is re-parented to it, never to init, so all of them stay findable as its descendants.
When COMMAND ends, or this process is told to stop (SIGTERM from the runner, or from the
kernel when `repro` dies in any way: its parent-death signal is SIGTERM, which it can
catch, where the session's own is SIGKILL), every descendant left is killed. Exit
status: COMMAND's, 128+N when a signal N ended it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.runner import lifetime

PR_SET_CHILD_SUBREAPER = 36


def _children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _descendants(pid: int) -> list[int]:
    todo, found = [pid], []
    while todo:
        for child in _children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL every descendant, then reap; again, until none is left (the orphans of a killed
    process come to this one)."""
    for _ in range(50):
        left = _descendants(os.getpid())
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    time.sleep(0.01)
            except ChildProcessError:
                break


def _stop(signum: int, _frame: Any) -> None:
    kill_descendants()
    os._exit(128 + signum)


def become_reaper() -> None:
    """This process as a reaper (this module's, and the run's fork server): orphaned descendants
    come to it, its parent's death is a SIGTERM, and SIGTERM or SIGINT end every descendant
    before it exits with 128+N."""
    if lifetime._PRCTL is not None:
        lifetime._PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        lifetime._PRCTL(lifetime.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    lifetime.die_with_parent_check()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def main(command: list[str], pass_fds: tuple[int, ...] = ()) -> int:
    become_reaper()
    child = subprocess.Popen(command, env={**os.environ, lifetime.PARENT_ENV: str(os.getpid())}, pass_fds=pass_fds)
    for fd in pass_fds:  # the session's now; this process has no use for it
        os.close(fd)
    code = child.wait()
    kill_descendants()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    args = sys.argv[1:]
    fds: tuple[int, ...] = ()
    if args[:1] == ["--pass-fd"]:  # an inherited descriptor the session gets too (the seal key's pipe)
        fds, args = (int(args[1]),), args[2:]
    sys.exit(main(args[1:] if args[:1] == ["--"] else args, fds))
