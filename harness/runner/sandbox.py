"""The sandbox of the code under test: every process that imports a target (the run's workers, the
probes, `repro exec`, `repro upstream-tests`) runs in it, so a hostile tree cannot reach the judge.

`enter()` turns the calling process into the sandbox's keeper and returns in a child that is the
sandbox's first process, as bubblewrap (Flatpak) and nsjail build one, with the kernel's calls and
no helper program:
- its own user, PID, mount, IPC and network namespaces: the host's processes are not in its `/proc`
  (a fresh one), the host's abstract unix sockets (the run's fork server, other runs') are not in
  its network (a loopback of its own), and it ends with every process it started;
- the whole file system read-only (the project, the venv, the target cache included), a private
  writable tmpfs on /dev/shm (TMPDIR, torch's compile cache), and the folders a caller names
  writable (a probe's report folder);
- no capabilities, no_new_privs, and a system-call filter (harness.runner.seccomp) that refuses
  ptrace, process_vm_readv/writev, pidfd_getfd, unshare, setns and the mount calls;
- limits: address space, processes (threads included), file size, no core files.

The keeper (outside) waits for the child and exits as it did; the child learns its pid as the host
sees it (`outer_pid()`), which the controller uses to end it. `refusal()` says why this kernel
refuses a sandbox; then target code runs only with `--no-sandbox` (REPRO_NO_SANDBOX=1).

`python -m harness.runner.sandbox [--writable DIR]... -- COMMAND...` runs a command in one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import resource
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.runner import lifetime, seccomp

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DISABLE_ENV = "REPRO_NO_SANDBOX"  # "1": target code runs unsandboxed (`--no-sandbox`)
OUTER_PID_ENV = "REPRO_SANDBOX_PID"  # the sandboxed process's pid as the host sees it
# A fresh tmpfs inside the sandbox, nobody else's. Not over /tmp: a user's script or a probe's folder
# may be there, visible (read-only) in the sandbox as everywhere else.
PRIVATE_TMP = "/dev/shm"
TMP_BYTES = 2 << 30
FILE_BYTES = 1 << 30
PROCESSES = 512  # threads count: torch's pools, a case's own subprocesses
ADDRESS_SPACE_SLACK = 16 << 30  # beyond the machine's memory: what libraries only reserve

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY = 1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
SYS_MOUNT_SETATTR = 442
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 47, 4
SYS_CAPSET = 126
CAPABILITY_VERSION_3 = 0x20080522
SIOCSIFFLAGS, IFF_UP = 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    """The kernel refused a step of building the sandbox."""

    def __str__(self) -> str:  # the step and the kernel's answer, without "[Errno N]"
        return str(self.strerror)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise SandboxError(code, f"{what}: {os.strerror(code)}")


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV) == "1"


def outer_pid() -> int:
    """This process's pid as the host (its controller) sees it."""
    return int(os.environ.get(OUTER_PID_ENV) or os.getpid())


def _encoded(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_encoded(source), _encoded(target), _encoded(fstype), ctypes.c_ulong(flags), _encoded(data)),
           f"mount {fstype or 'bind'} on {target}")


def _set_read_only(path: str, recursive: bool, read_only: bool = True) -> None:
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE if recursive else 0, attr, len(attr)),
           f"mount_setattr {path}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _loopback_up() -> None:
    """The namespace's own loopback (gloo's store for the Megatron cases listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP))


def _drop_capabilities() -> None:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", CAPABILITY_VERSION_3, 0)
    _check(_libc.syscall(SYS_CAPSET, header, bytes(24)), "capset")


def _limit() -> None:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for which, value in ((resource.RLIMIT_AS, memory + ADDRESS_SPACE_SLACK), (resource.RLIMIT_NPROC, PROCESSES),
                         (resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _build(writable: Sequence[str]) -> None:
    """In the sandbox's first process: its file system, network, limits and filter."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    _set_read_only("/", recursive=True)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("tmpfs", PRIVATE_TMP, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={TMP_BYTES}")
    for path in map(os.path.realpath, writable):  # bound onto itself, then made writable again
        _mount(path, path, None, MS_BIND)
        _set_read_only(path, recursive=False, read_only=False)
    _loopback_up()
    os.environ["TMPDIR"] = PRIVATE_TMP
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{PRIVATE_TMP}/torchinductor"  # the run's is shared with its judge
    _limit()
    _drop_capabilities()
    seccomp.install()


def _exit_as(status: int) -> None:
    """Exit as a child that ended with wait `status` did: by its signal where one ended it."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError):
            signal.signal(signum, signal.SIG_DFL)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signum)  # ignored by a namespace's first process: then 128+N
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _keep(init: int, channel: socket.socket) -> None:
    """The keeper, outside: tell the sandboxed process its pid as the host sees it (the kernel
    translates the sender's pid of a unix-socket message), wait for the sandbox, exit as it did.
    Never returns."""
    devnull = os.open(os.devnull, os.O_RDWR)  # the sandboxed process holds the caller's stdin and stdout alone
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sandboxed process, in the same process group, decides
    with contextlib.suppress(OSError):
        _, ancillary, _, _ = channel.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("3i")))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                channel.send(str(struct.unpack("3i", data)[0]).encode())
    channel.close()
    _, status = os.waitpid(init, 0)
    _exit_as(status)


def _first_process(channel: socket.socket, writable: Sequence[str]) -> None:
    """The sandbox's pid 1: builds it, forks the sandboxed process and reaps until that ends (the
    kernel then ends what else is left in it). Returns only in the sandboxed process."""
    _build(writable)
    worker = os.fork()
    if worker == 0:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        channel.send(b"?")  # the keeper reads the pid the kernel attaches
        pid = channel.recv(32)
        channel.close()
        if not pid.isdigit():
            os._exit(125)
        os.environ[OUTER_PID_ENV] = pid.decode()
        # Its parent is the sandbox's first process, which dies with the keeper (harness.runner.lifetime).
        os.environ[lifetime.PARENT_ENV] = str(os.getppid())
        return
    channel.close()
    for fd in (0, 1):  # the sandboxed process holds the caller's stdin and stdout alone
        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        ended, status = os.waitpid(-1, 0)
        if ended == worker:
            _exit_as(status)


def enter(writable: Sequence[str] = ()) -> None:
    """Make this single-threaded process the keeper of a new sandbox; returns only in the sandboxed
    process (pid 2 inside: a process's signals to itself work as anywhere). Raises SandboxError where
    the kernel refuses the namespaces (before any fork)."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(NAMESPACES), "unshare of the user, PID, mount, IPC and network namespaces")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    outside, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    outside.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    init = os.fork()
    if init:
        inside.close()
        _keep(init, outside)
    outside.close()
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        _first_process(inside, writable)
    except BaseException as exc:  # noqa: BLE001 — a sandbox half built never runs the code
        with contextlib.suppress(BaseException):
            os.write(2, f"repro: the sandbox could not be built: {exc}\n".encode())
        os._exit(125)


@functools.cache
def refusal() -> str | None:
    """Why this machine cannot give target code a sandbox (one line), or None; tried once in a
    child process, which builds one in full."""
    if reason := seccomp.unsupported():
        return reason
    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_read)
        os.dup2(ready_write, 2)  # what the sandbox's first process says when a step is refused
        try:
            enter()
            os.write(ready_write, b"ok")
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 — the reason is the answer
            with contextlib.suppress(BaseException):
                os.write(ready_write, str(exc).encode()[:500])
            os._exit(1)
    os.close(ready_write)
    answer = b""
    while chunk := os.read(ready_read, 512):
        answer += chunk
    os.close(ready_read)
    _, status = os.waitpid(child, 0)
    text = answer.decode(errors="replace").strip()
    if text == "ok" and os.waitstatus_to_exitcode(status) == 0:
        return None
    text = text.removeprefix("repro: the sandbox could not be built: ").removesuffix("ok").strip()
    return " ".join(text.split()) or f"the sandbox's first process exited with status {status}"


def status_line() -> str:
    """The one line `repro devices` and `repro targets` print."""
    if disabled():
        return "sandbox: off (--no-sandbox): target code runs with this user's full reach"
    if reason := refusal():
        return f"sandbox: refused by this kernel ({reason}); target code runs only with --no-sandbox"
    return "sandbox: on (own user, PID, mount and network namespaces; read-only file system; seccomp; limits)"


def require() -> None:
    """Before target code runs: a UsageError (one line) where a sandbox is needed but refused."""
    from harness.errors import UsageError

    if not disabled() and (reason := refusal()):
        raise UsageError(f"this kernel refuses the sandbox for target code ({reason}); "
                         "--no-sandbox runs it unsandboxed")


def command(argv: Sequence[str], writable: Sequence[str] = ()) -> list[str]:
    """`argv` run in a sandbox (as is with --no-sandbox)."""
    if disabled():
        return list(argv)
    # -S: the command's environment may name a target to activate at start-up (harness.targets.site's
    # sitecustomize), which must not run here, outside; so the project is put on the path by hand.
    boot = f"import sys; sys.path.insert(0, {str(PROJECT_ROOT)!r}); from harness.runner.sandbox import main; " \
           "sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-S", "-c", boot, *(f"--writable={w}" for w in writable), "--", *argv]


def main(argv: Sequence[str]) -> int:
    split = list(argv).index("--") if "--" in argv else len(argv)
    writable = [a.split("=", 1)[1] for a in argv[:split] if a.startswith("--writable=")]
    run = list(argv[split + 1:])
    if not run:
        print("usage: python -m harness.runner.sandbox [--writable=DIR]... -- COMMAND...", file=sys.stderr)
        return 2
    try:
        enter(writable)
    except SandboxError as exc:
        print(f"repro: no sandbox: {exc}; --no-sandbox runs target code unsandboxed", file=sys.stderr)
        return 125
    try:
        os.execvp(run[0], run)
    except OSError as exc:
        print(f"repro: cannot run {run[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if exc.errno == errno.ENOENT else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
