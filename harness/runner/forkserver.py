"""`python -m harness.runner.forkserver ADDRESS`: a run's fork server. It imports torch, pytest,
xdist and the harness once, then forks each local xdist worker of the run's sessions from that
state when the worker's client asks (harness.runner.forkclient), so a worker's start-up is its
target and Megatron, not torch again: once per run instead of once per worker.

What held for a worker started by xdist still holds for a forked one:
- its death is seen by its controller as before, and recorded against its case: the worker
  holds the xdist channel's pipes alone (its client closes its copies);
- it ends with its session: its client is a child of the session's controller, dies with it
  (parent-death signal) and is killed with the session (harness.runner.reaper); when the
  client's connection closes, this server kills the worker;
- a process a case starts ends with the session: each worker is a child subreaper, so what
  its cases leave is its own; what is left when it ends is re-parented here and killed. This
  server is a child subreaper too, and on SIGTERM (sent by the kernel when the run dies too)
  kills every descendant;
- only a peer of this server's own user gets a worker (SO_PEERCRED); the address is an
  abstract socket, so nothing is written to the file system;
- no connection holds up another's worker: every request is read a piece at a time as it
  arrives, and one not complete within `REQUEST_DEADLINE_S`, larger than `MAX_REQUEST_BYTES`
  or malformed is dropped without a fork (its client then starts the plain worker);
- each worker runs in a sandbox of its own (harness.runner.sandbox), entered in the forked child
  before it runs the client's code: this server, its socket and the other runs' stay outside;
- where the imports set up an accelerator's runtime, which a fork does not carry (`fork_hazard`),
  the server says why in its log (sessions/forkserver.log) and ends: the clients then start
  their workers themselves.

Protocol, one connection per worker: the client sends its stdin, stdout and stderr (SCM_RIGHTS)
with an 8-byte length, then that many bytes of JSON {"code", "env", "cwd", "flags"}; the server
answers {"pid": N}\\n once the worker is forked, and {"exit": STATUS}\\n when it has ended. The env
maps text to text, the cwd is text, the flags a list of text; each may be left out.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.metadata
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

from harness.runner import lifetime, reaper, sandbox

ADDRESS_ENV = "REPRO_FORKSERVER"  # the abstract socket's name, for the sessions' clients
HEADER = struct.Struct("!Q")
# A client sends its whole request as soon as it connects; these bound what a slow, silent or hostile
# connection (any process of the run's user can find the address in /proc/net/unix) may hold.
REQUEST_DEADLINE_S = 10.0
# A request is xdist's one-line bootstrap and an environment, which exec bounds (ARG_MAX, 2 MiB with
# an 8 MiB stack): a few KB in a run. A larger one is refused, and its client starts the plain worker.
MAX_REQUEST_BYTES = 4 << 20
MAX_PENDING = 64  # connections without a worker yet; the oldest is dropped for a new one
MAX_REFUSALS_LOGGED = 100  # the log is held in memory (sessions/forkserver.log): a flood of refusals is counted
_CHUNK = 1 << 16


# What every worker imports before its target: torch above all (a second of CPU a worker), pytest and
# xdist, and the harness's worker side, harness.runner.state included (taken before any target).
PRELOAD = ("torch", "pytest", "execnet", "xdist.plugin", "xdist.remote", "cases.clients", "harness.runner.plugin",
           "harness.runner.records", "harness.runner.state", "harness.targets.loader")


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def fork_hazard() -> str | None:
    """Why workers forked from this process would be unsafe, or None. An accelerator's runtime
    set up by the imports (its threads and device handles) does not survive a fork: CUDA's, or
    that of a device backend imported with torch (torch_npu, for one, when torch autoloads it)."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialized by the imports"
    # The harness turns torch's autoloading off (harness/__init__.py); a user may turn it on again.
    backends = {entry.value.split(":")[0] for entry in importlib.metadata.entry_points(group="torch.backends")}
    if loaded := sorted(name for name in backends | {"torch_npu"} if name in sys.modules):
        return f"the device backend {', '.join(loaded)} was imported with torch"
    return None


def _parse_request(body: bytes) -> dict[str, Any]:
    """The request in `body`, checked for what the worker will use: a forked child that fails on
    a malformed field would fail after its fork, as a worker."""
    request = json.loads(body)
    if not isinstance(request, dict) or not isinstance(request.get("code"), str):
        raise TypeError("the request has no code to run")
    env, cwd, flags = request.get("env", {}), request.get("cwd"), request.get("flags", [])
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError("the request's env is not a map of text to text")
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError("the request's cwd is not text")
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise TypeError("the request's flags are not a list of text")
    return request


@dataclass
class _Pending:
    """A connection's request, as far as it has arrived."""

    deadline: float
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    size: int | None = None  # the body's, once the header is in

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def _become_worker(request: dict[str, Any], fds: list[int], keep_out: list[int], server: int) -> None:
    """In the forked child: the process `python -c CODE` would have been, with the client's
    descriptors, environment and directory. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in keep_out:  # the server's sockets and its signal pipe are not the worker's
            with contextlib.suppress(OSError):
                os.close(fd)
        if lifetime._PRCTL is not None:  # its descendants stay its own; it dies with this server
            lifetime._PRCTL(reaper.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        lifetime.die_with_parent(server)  # not getppid(): a server already gone leaves another parent
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request.get("cwd") or "/")
        os.environ.clear()
        # The parent it finds is this server: its session's controller is its client's parent.
        os.environ.update({**request.get("env", {}), lifetime.PARENT_ENV: str(server)})
        if not sandbox.disabled():  # from here on the worker runs in its own sandbox (harness.runner.sandbox)
            try:
                sandbox.enter()
            except sandbox.SandboxError as exc:  # never run unsandboxed unless asked: the worker dies, one line
                os.write(2, f"repro: no sandbox for this worker: {exc}; --no-sandbox runs it unsandboxed\n".encode())
                os._exit(125)
        tempfile.tempdir = None  # found again from the worker's TMPDIR (the run's scratch folder), not this server's
        sys.dont_write_bytecode = sys.dont_write_bytecode or "-B" in request.get("flags", [])
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)  # -u
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
        sys.argv = ["-c"]
        sys.path[0] = ""  # as `python -c` has it
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        try:
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)  # noqa: S102 — the client's `-c`
            code = 0
        except SystemExit as exc:  # as Python exits: None is 0, an int itself, anything else printed and 1
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 — reported as Python would, in the worker's stderr
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Server:
    """The accept, fork and reap loop. It never waits on one client: every socket is
    non-blocking, and a request is read in pieces as they arrive."""

    def __init__(self, listener: socket.socket, wakeup: tuple[int, int]) -> None:
        self.listener = listener
        self.listener.setblocking(False)
        self.wakeup, self.wakeup_write = wakeup
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(self.wakeup, selectors.EVENT_READ)
        self.workers: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.pending: dict[socket.socket, _Pending] = {}  # connected, no worker yet
        self.refused = 0

    def serve(self) -> None:
        while True:
            timeout = None
            if self.pending:
                timeout = max(0.0, min(p.deadline for p in self.pending.values()) - time.monotonic())
            for key, _events in self.selector.select(timeout):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wakeup:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup, 512)
                    self._reap()
                # An event of this batch may be for a connection an earlier one dropped (its pid reaped).
                elif isinstance(key.data, _Pending):
                    if self.pending.get(key.fileobj) is key.data:  # type: ignore[call-overload]
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                elif self.workers.get(key.data) is key.fileobj:
                    self._client_gone(key.fileobj, key.data)  # type: ignore[arg-type]
            now = time.monotonic()
            for conn, late in [(c, p) for c, p in self.pending.items() if p.deadline <= now]:
                self._refuse(conn, late, f"not complete within {REQUEST_DEADLINE_S:g} s")

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors, for one: the oldest request gives its back
            os.write(2, f"repro fork server: no connection accepted: {exc}\n".encode())
            if self.pending:
                self._refuse(*min(self.pending.items(), key=lambda item: item[1].deadline), "dropped for a new one")
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():  # another user's process: no worker, no answer
            conn.close()
            return
        if len(self.pending) >= MAX_PENDING:  # the oldest has had longest to send: a client sends at once
            self._refuse(*min(self.pending.items(), key=lambda item: item[1].deadline), "dropped for a new one")
        conn.setblocking(False)
        self.pending[conn] = _Pending(time.monotonic() + REQUEST_DEADLINE_S)
        self.selector.register(conn, selectors.EVENT_READ, self.pending[conn])

    def _read(self, conn: socket.socket, pending: _Pending) -> None:
        """What has arrived of `conn`'s request, never more than the request: bytes after it stay
        unread, and are read as the client's going once it has its worker."""
        want = HEADER.size - len(pending.data) if pending.size is None else HEADER.size + pending.size - len(pending.data)
        try:
            data, fds, flags, _address = socket.recv_fds(conn, min(want, _CHUNK), 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._refuse(conn, pending, str(exc))
            return
        pending.fds += fds
        if flags & socket.MSG_CTRUNC or len(pending.fds) > 3:
            self._refuse(conn, pending, "more than three descriptors")
            return
        if not data:
            self._refuse(conn, pending, "the request ended early")
            return
        pending.data += data
        if pending.size is None and len(pending.data) == HEADER.size:
            pending.size, = HEADER.unpack(pending.data)
            if len(pending.fds) != 3:
                self._refuse(conn, pending, "a request is 8 bytes of length with three descriptors")
                return
            if pending.size > MAX_REQUEST_BYTES:
                self._refuse(conn, pending, f"{pending.size} bytes, more than {MAX_REQUEST_BYTES}")
                return
        if pending.size is None or len(pending.data) < HEADER.size + pending.size:
            return
        try:
            request = _parse_request(bytes(pending.data[HEADER.size:]))
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            self._refuse(conn, pending, str(exc))
            return
        del self.pending[conn]
        self._fork(conn, request, pending.fds)

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        # Other clients' connections and the descriptors of their requests are not the worker's:
        # a copy of another client's stdout would hide that client's worker's death from its controller.
        keep_out = [self.listener.fileno(), self.wakeup, self.wakeup_write, self.selector.fileno(), conn.fileno(),
                    *(c.fileno() for c in self.workers.values()),
                    *(fd for c, p in self.pending.items() for fd in (c.fileno(), *p.fds))]
        server = os.getpid()
        worker = os.fork()
        if worker == 0:
            _become_worker(request, fds, keep_out, server)
        for fd in fds:
            os.close(fd)
        self.workers[worker] = conn
        self.selector.modify(conn, selectors.EVENT_READ, worker)
        self._send(conn, {"pid": worker})

    def _client_gone(self, conn: socket.socket, pid: int) -> None:
        """The client only ever waits: anything read from it now means it went away (or broke the
        protocol), and its worker goes too."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._drop(conn)

    def _refuse(self, conn: socket.socket, pending: _Pending, why: str) -> None:
        self.refused += 1
        if self.refused <= MAX_REFUSALS_LOGGED:
            os.write(2, f"repro fork server: a request refused: {why}\n".encode())
        elif self.refused == MAX_REFUSALS_LOGGED + 1:
            os.write(2, b"repro fork server: more requests refused; no more are logged\n")
        self.pending.pop(conn, None)
        pending.close_fds()
        self._drop(conn)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if (conn := self.workers.pop(pid, None)) is not None:
                self._send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                self._drop(conn)
        # What an ended worker left behind was re-parented here: it ends too.
        for child in reaper._children_of(os.getpid()):
            if child not in self.workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)

    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(message).encode() + b"\n")

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        conn.close()


def main(address: str) -> int:
    reaper.become_reaper()  # orphans come here; the run's death, a SIGTERM, ends every worker
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)  # bound before the imports: a client that comes early waits for them
    listener.listen(64)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_read, False)
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # handled through the wakeup pipe
    preload()
    if hazard := fork_hazard():  # the clients find no server and start their workers themselves
        os.write(2, f"repro fork server: no worker is forked: {hazard}\n".encode())
        return 0
    gc.freeze()  # the imports' objects stay out of the workers' collections: their pages stay shared
    Server(listener, (wakeup_read, wakeup_write)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
