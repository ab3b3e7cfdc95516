"""A worker's cases run in a child process the worker forks once its target is loaded, and
forks again when that child dies: a case that ends its process (a segfault, `os._exit`, a
signal) costs one fork, not an xdist worker replacement (a new worker that loads the target
again, and a follow-up session for the rest of its chunk).

The child runs case after case, as the worker did, so its state carries from one case to the
next as a worker's always has (harness.runner.state names what a case changed); the worker
keeps the state it forks from, loaded and untouched by any case. The child hands back each
case's raw observation as the JSON text the worker would have sent, and the worker forwards
it as its own (harness.runner.plugin): the child runs the same code as the worker, so what it
can send is what a worker could.

A child that dies with a case in flight is that case's crash, with its signal or exit status
(from waitpid, never from the child's word); one still running past the per-case timeout and a
grace is ended here, and the case is a timeout. Nothing waits on the child without a bound where
the run has a per-case timeout. A child dying of a fatal signal writes its Python frames
(faulthandler) to the worker before the kernel tears it down, which for a process of a worker's
size takes about as long as a fork: the worker starts the next case in its spare meanwhile.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import struct
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.runner import lifetime

HEADER = struct.Struct("!Q")
_CHUNK = 1 << 20
MAX_FRAMES = 3000  # of what a child's fault handler writes (innermost frames first), kept for the record
ENDING_S = 1.0  # a child whose answer pipe closed, before it is ended: a process ending takes a moment

# What the child runs: a case's fields in, its raw observation's JSON text and its harness error out.
RunCase = Callable[[dict[str, Any]], tuple[str, str | None]]


@dataclass
class Observed:
    """A case the child ran: its raw observation's text, and the harness error it names, if any."""

    raw_text: str
    harness_error: str | None


@dataclass
class Died:
    """A case whose process ended before it answered: `why` as a dead worker's record says it
    (harness.runner.records.LOST_TYPES), `text` how it ended."""

    why: str
    text: str


class _Gone(Exception):
    """The child ended (or its answer is not one) before a whole frame came."""


class _Late(Exception):
    """The child did not answer before the deadline."""


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, size: int, watch: Any = None, deadline: float | None = None) -> bytes:
    """`size` bytes from `fd`; when `watch` (a CaseChild) is given, a wait bounded by `deadline` (monotonic)."""
    parts, left = [], size
    while left:
        if watch is not None:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = watch.watch.poll(None if timeout is None else int(timeout * 1000) + 1)
            if not events:
                raise _Late
            if any(ready == watch.faults for ready, _mask in events):
                watch.fatal_signal()
            if not any(fd == ready and mask & (select.POLLIN | select.POLLHUP) for ready, mask in events):
                if any(ready == watch.pidfd for ready, _mask in events):
                    raise _Gone  # only the child's own exit is ready: it ended without a whole answer
                continue
        piece = os.read(fd, min(left, _CHUNK))
        if not piece:
            raise _Gone
        parts.append(piece)
        left -= len(piece)
    return b"".join(parts)


def _read_frame(fd: int, watch: Any = None, deadline: float | None = None) -> bytes:
    size, = HEADER.unpack(_read_exact(fd, HEADER.size, watch, deadline))
    return _read_exact(fd, size, watch, deadline)


def _child_main(requests: int, answers: int, faults: int, close: list[int], worker: int, run_case: RunCase) -> None:
    """In the forked child: answer each case the worker sends until it closes the pipe. Never returns."""
    code = 0
    try:
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        lifetime.die_with_parent(worker)
        # A fatal signal (SIGSEGV, SIGABRT, ...) writes the Python frames to the worker at once, before the
        # kernel tears this process down: the worker starts the next case meanwhile.
        faulthandler.enable(file=faults, all_threads=False)
        while True:
            try:
                fields = json.loads(_read_frame(requests))
            except _Gone:  # the worker is done with this child
                break
            raw_text, harness_error = run_case(fields)
            _write_frame(answers, raw_text.encode())
            _write_frame(answers, json.dumps(harness_error).encode())
    except BaseException:  # noqa: BLE001 — seen by the worker as this child's death, its case's crash
        code = 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)


def _ended(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        return f"killed by signal {-code}"
    return f"exited with status {code}"


class CaseChild:
    """One child of the worker, forked from the worker's present state, that runs its cases."""

    def __init__(self, run_case: RunCase, close_in_child: list[int]) -> None:
        requests_r, self.requests = os.pipe()
        self.answers, answers_w = os.pipe()
        self.faults, faults_w = os.pipe()
        worker = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            _child_main(requests_r, answers_w, faults_w, [self.requests, self.answers, self.faults, *close_in_child],
                        worker, run_case)
        for fd in (requests_r, answers_w, faults_w):
            os.close(fd)
        os.set_blocking(self.faults, False)
        self.dying: Callable[[], None] | None = None
        self.frames = b""  # what the child's fault handler wrote
        self.watch = select.poll()
        self.watch.register(self.answers, select.POLLIN)
        self.watch.register(self.faults, select.POLLIN)
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # its exit seen even when a process it started keeps the pipe
            self.pidfd = os.pidfd_open(self.pid)
            self.watch.register(self.pidfd, select.POLLIN)

    def send(self, fields: dict[str, Any]) -> None:
        """Start a case in the child; its answer is `receive`d."""
        self.sent_at = time.monotonic()
        try:
            _write_frame(self.requests, json.dumps(fields).encode())
        except OSError:  # it died between cases: seen by `receive` as this case's crash
            pass

    def fatal_signal(self) -> None:
        """The child's fault handler wrote (it is dying of a fatal signal: `dying` is called, once), or
        closed its end."""
        self.watch.unregister(self.faults)
        if self._read_frames() and self.dying is not None:
            dying, self.dying = self.dying, None
            dying()

    def receive(self, seconds: float | None, meanwhile: Callable[[], None] | None = None,
                dying: Callable[[], None] | None = None) -> Observed | Died:
        """The answer to the case sent last; `seconds`, when given, bounds the wait from its start: past
        it the child is ended. `meanwhile` is called first, while the child runs the case; `dying` when
        the child's fault handler reports a fatal signal, before the kernel has torn it down."""
        deadline = None if seconds is None else self.sent_at + seconds
        self.dying = dying
        try:
            if meanwhile is not None:
                meanwhile()
            raw_text = _read_frame(self.answers, self, deadline).decode()
            error = json.loads(_read_frame(self.answers, self, deadline))
        except _Late:
            return Died("per-case timeout", f"the case's process (pid {self.pid}) was still running {seconds:g} s "
                        "after the case started (per-case timeout and a grace): ended; " + self._end(kill=True))
        except (_Gone, OSError, ValueError) as exc:  # OSError: a broken pipe; ValueError: not an answer
            while self._read_frames():  # all of it: the child has ended
                pass
            how = self._end(kill=not isinstance(exc, _Gone))
            frames = self.frames.decode(errors="backslashreplace").strip()
            return Died("worker died", f"the case's process (pid {self.pid}, forked by the worker) {how} "
                        "while the case ran" + (f"; its fault handler wrote:\n{frames}" if frames else ""))
        if not (error is None or isinstance(error, str)):
            return Died("worker died", f"the case's process (pid {self.pid}) answered no harness error: "
                        + self._end(kill=True))
        return Observed(raw_text, error)

    def _end(self, kill: bool) -> str:
        """End the child and say how it ended. Without `kill` it is ending by itself (its answer
        pipe closed): it is given `ENDING_S` to do so, then ended."""
        waited_until = time.monotonic() + (0 if kill else ENDING_S)
        while not kill:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.close()
                return _ended(status)
            if time.monotonic() >= waited_until:
                break
            if self.pidfd is not None:  # readable once it has ended
                select.select([self.pidfd], [], [], max(0.0, waited_until - time.monotonic()))
            else:
                time.sleep(0.001)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _pid, status = os.waitpid(self.pid, 0)
        self.close()
        return _ended(status)

    def _read_frames(self) -> bool:
        """Whether the child's fault handler wrote more; what it wrote is kept, up to `MAX_FRAMES`."""
        try:
            more = os.read(self.faults, MAX_FRAMES)
        except OSError:  # BlockingIOError: nothing more
            return False
        self.frames = (self.frames + more)[:MAX_FRAMES]
        return bool(more)

    def descriptors(self) -> list[int]:
        """This process's ends of the child's pipes and its pidfd: never another child's to hold."""
        return [fd for fd in (self.requests, self.answers, self.faults, self.pidfd) if fd is not None and fd >= 0]

    def close(self) -> None:
        """Let go of the child: it ends when it reads the closed pipe (or dies with this process)."""
        for fd in (self.requests, self.answers, self.faults, self.pidfd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = None
        self.requests = self.answers = self.faults = -1

    @property
    def alive(self) -> bool:
        """Whether it can take a case: false once it died, or was let go."""
        return self.requests >= 0
