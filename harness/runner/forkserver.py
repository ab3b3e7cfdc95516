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
- where the imports set up an accelerator's runtime, which a fork does not carry (`fork_hazard`),
  the server says why in its log (sessions/forkserver.log) and ends: the clients then start
  their workers themselves.

Protocol, one connection per worker: the client sends its stdin, stdout and stderr (SCM_RIGHTS)
with an 8-byte length, then that many bytes of JSON {"code", "env", "cwd", "flags"}; the server
answers {"pid": N}\\n once the worker is forked, and {"exit": STATUS}\\n when it has ended.
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
import traceback
import types
from typing import Any

from harness.runner import lifetime, reaper

ADDRESS_ENV = "REPRO_FORKSERVER"  # the abstract socket's name, for the sessions' clients
HEADER = struct.Struct("!Q")


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


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The client's three descriptors and its request."""
    header, fds, _flags, _address = socket.recv_fds(conn, HEADER.size, 3)
    try:
        if len(header) != HEADER.size or len(fds) != 3:
            raise ValueError("a request is 8 bytes of length with three descriptors")
        size, = HEADER.unpack(header)
        body = b""
        while len(body) < size:
            part = conn.recv(size - len(body))
            if not part:
                raise ValueError("the request ended early")
            body += part
        request = json.loads(body)
        if not isinstance(request, dict) or not isinstance(request.get("code"), str):
            raise TypeError("the request has no code to run")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


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
    """The accept, fork and reap loop."""

    def __init__(self, listener: socket.socket, wakeup: tuple[int, int]) -> None:
        self.listener = listener
        self.wakeup, self.wakeup_write = wakeup
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(self.wakeup, selectors.EVENT_READ)
        self.workers: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.pending: set[socket.socket] = set()  # connected, no worker yet

    def serve(self) -> None:
        while True:
            for key, _events in self.selector.select():
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wakeup:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup, 512)
                    self._reap()
                else:
                    self._from_client(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():  # another user's process: no worker, no answer
            conn.close()
            return
        self.pending.add(conn)
        self.selector.register(conn, selectors.EVENT_READ, None)

    def _from_client(self, conn: socket.socket, pid: int | None) -> None:
        if pid is not None:  # the client went away (it only ever waits): its worker goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._drop(conn)
            return
        self.pending.discard(conn)
        try:
            conn.settimeout(10)
            request, fds = _read_request(conn)
        except (OSError, ValueError, TypeError) as exc:
            os.write(2, f"repro fork server: a request refused: {exc}\n".encode())
            self._drop(conn)
            return
        keep_out = [self.listener.fileno(), self.wakeup, self.wakeup_write, self.selector.fileno(),
                    *(c.fileno() for c in (*self.workers.values(), *self.pending, conn))]
        server = os.getpid()
        worker = os.fork()
        if worker == 0:
            _become_worker(request, fds, keep_out, server)
        for fd in fds:
            os.close(fd)
        self.workers[worker] = conn
        self.selector.modify(conn, selectors.EVENT_READ, worker)
        self._send(conn, {"pid": worker})

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
