"""The run's fork server (harness.runner.forkserver) and its client: a worker forked with torch
already imported, that still behaves as the `python -c CODE` xdist would have started, and ends
with whoever asked for it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runner import reaper, sandbox
from harness.runner.forkserver import ADDRESS_ENV, MAX_PENDING
from harness.runner.rundir import session_name
from tests.conftest import REPO
from tests.processes import alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's subreaper and abstract sockets")

# What the worker reports: its parent, whether torch was there before its code ran, its directory and TMPDIR.
REPORT = ("import os, sys, tempfile; print(os.getppid(), 'torch' in sys.modules, os.getcwd(), tempfile.gettempdir(), "
          "os.environ.get('ASKED'), flush=True)")


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.05)
    return not any(map(alive, pids))


def _start_server(**popen: object) -> tuple[subprocess.Popen[bytes], str]:
    """A fork server, once it listens (a client that finds none starts the plain worker)."""
    address = f"te-fuser-repro-test-{secrets.token_hex(6)}"
    process = subprocess.Popen([sys.executable, "-m", "harness.runner.forkserver", address], cwd=REPO,
                               **{"env": {**os.environ, "PYTHONPATH": str(REPO)}, **popen})  # type: ignore[call-overload]
    deadline = time.monotonic() + 60
    while f"@{address}" not in Path("/proc/net/unix").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return process, address


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    process, address = _start_server()
    # Served once: its imports are done, so no test's timing or deadline includes them.
    _client(address, "pass", tmp_path_factory.mktemp("first")).communicate(timeout=300)
    yield process, address
    process.terminate()
    process.wait(timeout=30)


def _client(address: str | None, code: str, cwd: Path, sandboxed: bool = False, **env: str) -> subprocess.Popen[str]:
    """A worker's client. Unsandboxed unless asked: these tests look at the worker's processes from
    outside, by the pids it reports (in a sandbox, its own namespace's)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **({} if sandboxed else {sandbox.DISABLE_ENV: "1"}), **env}
    environment.pop(ADDRESS_ENV, None)
    if address:
        environment[ADDRESS_ENV] = address
    return subprocess.Popen([sys.executable, "-S", "-m", "harness.runner.forkclient", "-u", "-c", code], cwd=cwd,
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_forked_worker_has_torch_and_the_clients_directory_environment_and_exit_status(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    process, address = server
    client = _client(address, f"{REPORT}; raise SystemExit(7)", tmp_path, TMPDIR=str(tmp_path), ASKED="yes")
    out, err = client.communicate(timeout=120)
    parent, torch_there, cwd, tmp, asked = out.split()
    assert int(parent) == process.pid and torch_there == "True", err
    assert (cwd, tmp, asked) == (str(tmp_path), str(tmp_path), "yes")
    assert client.returncode == 7


def test_without_a_server_the_client_is_the_plain_worker(tmp_path: Path) -> None:
    for address in (None, f"te-fuser-repro-test-{secrets.token_hex(6)}"):  # none named; none listening
        client = _client(address, f"{REPORT}; raise SystemExit(5)", tmp_path, ASKED="plain")
        out, err = client.communicate(timeout=120)
        parent, torch_there, *_rest, asked = out.split()
        assert int(parent) == os.getpid() and torch_there == "False" and asked == "plain", err
        assert client.returncode == 5


def test_no_worker_is_forked_where_torch_autoloads_a_device_backend(tmp_path: Path) -> None:
    # A device backend as torch_npu registers itself: an entry point of the group torch.backends,
    # which torch calls at import. Its runtime would not survive a fork.
    (tmp_path / "fake_npu.py").write_text("def autoload():\n    pass\n")
    info = tmp_path / "fake_npu-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-npu\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nfake_npu = fake_npu:autoload\n")
    # The harness turns torch's autoloading off; a user who turns it on again gets it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    process, address = _start_server(env=env, stderr=subprocess.PIPE)
    try:
        _, said_bytes = process.communicate(timeout=60)  # it ends after saying why
        said = said_bytes.decode()
        assert "no worker is forked: the device backend fake_npu was imported with torch" in said, said
        client = _client(address, f"{REPORT}; raise SystemExit(4)", tmp_path, PYTHONPATH=env["PYTHONPATH"],
                         TORCH_DEVICE_BACKEND_AUTOLOAD="1")
        out, err = client.communicate(timeout=120)
        parent, torch_there, *_rest = out.split()
        assert int(parent) == os.getpid() and torch_there == "False" and client.returncode == 4, err
    finally:
        process.kill()
        process.wait()


def test_the_worker_ends_with_its_client(server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    _process, address = server
    client = _client(address, "import os, time; print(os.getpid(), flush=True); time.sleep(600)", tmp_path)
    assert client.stdout is not None
    worker = int(client.stdout.readline())
    assert alive(worker)
    client.kill()  # as the session's reaper, or the kernel when the session's controller dies, ends it
    client.wait()
    assert _gone_within([worker], 10)


@pytest.mark.skipif(bool(sandbox.refusal()), reason=f"no sandbox: {sandbox.refusal()}")
def test_a_forked_worker_is_sandboxed_and_ends_with_its_client(server: tuple[subprocess.Popen[bytes], str],
                                                                tmp_path: Path) -> None:
    _process, address = server
    code = ("import os, tempfile, time; print(os.getpid(), os.environ['REPRO_SANDBOX_PID'], "
            "sorted(int(e) for e in os.listdir('/proc') if e.isdigit()) == [1, 2], tempfile.gettempdir(), flush=True); "
            "time.sleep(600)")
    client = _client(address, code, tmp_path, sandboxed=True)
    assert client.stdout is not None
    inside, outside, few_processes, tmp = client.stdout.readline().split()
    # Its own PID namespace (pid 2, under the sandbox's first process), its own /proc, its private tmp.
    assert (inside, few_processes, tmp) == ("2", "True", sandbox.PRIVATE_TMP)
    assert alive(int(outside))
    client.kill()
    client.wait()
    assert _gone_within([int(outside)], 10)


def test_what_a_worker_leaves_behind_ends_and_the_server_ends_every_worker(tmp_path: Path) -> None:
    process, address = _start_server()
    try:
        # A daemon of its own session (setsid), left behind by a worker that then ends.
        leaver = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
                  "time.sleep(600)'], start_new_session=True, stdout=subprocess.DEVNULL); print(p.pid, flush=True)")
        client = _client(address, leaver, tmp_path)
        out, err = client.communicate(timeout=120)
        daemon = int(out)
        assert client.returncode == 0, err
        assert _gone_within([daemon], 10)
        # A worker still running, and what it started, end with the server.
        client = _client(address, f"{leaver}; import time; time.sleep(600)", tmp_path)
        assert client.stdout is not None
        daemon = int(client.stdout.readline())
        worker = reaper._children_of(process.pid)
        assert worker and alive(daemon)
        process.terminate()  # as the kernel does when the run dies
        process.wait(timeout=30)
        assert _gone_within([daemon, *worker], 10)
        client.wait(timeout=30)
    finally:
        process.kill()
        process.wait()


def test_a_runs_workers_are_forked_with_torch_imported(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "repro", "run", "--matrix", "smoke", "--only", "pipeline=rmsnorm",
                             "--targets", "te-2.20.2", "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    startup = (out / "sessions" / f"{session_name('te-2.20.2')}.startup.jsonl").read_text().splitlines()
    assert [json.loads(line)["torch_preloaded"] for line in startup] == [True]
    assert not (out / "sessions" / "forkserver.log").exists()  # it had nothing to say


def test_no_worker_is_forked_after_cuda_was_initialized(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from harness.runner.forkserver import fork_hazard

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # whatever this test process did before
    assert fork_hazard() is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as a GPU machine's would be after a CUDA call
    assert fork_hazard() == "CUDA was initialized by the imports"


# Slow and hostile connections to the server (any process of the run's user can find its address
# in /proc/net/unix). None of them may hold up another client's worker.
LENGTH = struct.Struct("!Q")  # the request's 8-byte length


def _connect(address: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("\0" + address)
    return conn


def _send_header(conn: socket.socket, size: int, data: bytes | None = None, fds: int = 3) -> None:
    """The request's first bytes (its length, or `data`) with `fds` descriptors, as a client sends them."""
    null = [os.open(os.devnull, os.O_RDWR) for _ in range(fds)]
    try:
        socket.send_fds(conn, [LENGTH.pack(size) if data is None else data], null)
    finally:
        for fd in null:
            os.close(fd)


def _closed_by_server(conn: socket.socket, seconds: float) -> bool:
    """Whether the server closes `conn` within `seconds`, without a byte of answer."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([conn], [], [], left)[0]:
            try:
                return conn.recv(1 << 16) == b""
            except ConnectionResetError:
                return True
    return False


class _Dripper(threading.Thread):
    """Sends each connection its bytes one a second, until told to stop or the server closes it."""

    def __init__(self, drips: dict[socket.socket, bytes]) -> None:
        super().__init__(daemon=True)
        self.drips, self.stop = {conn: iter(data) for conn, data in drips.items()}, threading.Event()

    def run(self) -> None:
        while self.drips and not self.stop.wait(1.0):
            for conn, data in list(self.drips.items()):
                try:
                    conn.send(bytes([next(data)]))
                except (OSError, StopIteration):
                    del self.drips[conn]


def _worker_start_s(address: str, cwd: Path, server: int) -> float:
    """Seconds from asking the server at `address` for a worker to the worker's first line; infinite
    when none has answered within 30 s (a stalled server's would still be waiting)."""
    started = time.monotonic()
    client = _client(address, "import os; print(os.getppid(), flush=True)", cwd)
    assert client.stdout is not None
    if not select.select([client.stdout], [], [], 30)[0]:
        client.kill()  # its descriptors may sit unread in a stalled server's queue: no communicate()
        client.wait()
        return float("inf")
    took = time.monotonic() - started
    out, err = client.communicate(timeout=120)
    assert int(out) == server and client.returncode == 0, err  # forked, not the plain fallback
    return took


def test_slow_or_silent_clients_hold_up_no_worker_and_are_dropped(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    process, address = server
    alone = _worker_start_s(address, tmp_path, process.pid)
    silent = _connect(address)  # connects, sends nothing
    header_drip = _connect(address)  # its length one byte a second, then its body
    _send_header(header_drip, 0, data=LENGTH.pack(1000)[:1])
    body_drip = _connect(address)  # a whole length, then its body one byte a second
    _send_header(body_drip, 1000)
    dripper = _Dripper({header_drip: LENGTH.pack(1000)[1:] + b"{" * 1000, body_drip: b"{" * 1000})
    dripper.start()
    try:
        time.sleep(0.5)  # the server has all three before the client asks
        beside = _worker_start_s(address, tmp_path, process.pid)
        print(f"worker start: {alone:.2f} s alone, {beside:.2f} s beside three slow clients")
        assert beside < 5, f"{beside:.1f} s for a worker beside slow clients ({alone:.1f} s alone)"
        # Each is dropped once its time to send a request is up, however it drips.
        for conn in (silent, header_drip, body_drip):
            assert _closed_by_server(conn, 15), "a slow client was kept past its deadline"
        assert process.poll() is None
    finally:
        dripper.stop.set()
        for conn in (silent, header_drip, body_drip):
            conn.close()


def test_an_oversize_request_is_dropped_at_its_length_without_holding_up_a_worker(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    process, address = server
    oversize = _connect(address)
    _send_header(oversize, 1 << 40)  # a TiB of request
    sent = 0

    def stream() -> None:  # as fast as the server takes it, for at most 20 s
        nonlocal sent
        oversize.settimeout(1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sent += oversize.send(b" " * (1 << 16))
            except TimeoutError:
                continue
            except OSError:
                return

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        time.sleep(0.5)
        took = _worker_start_s(address, tmp_path, process.pid)
        print(f"worker start beside an oversize request: {took:.2f} s; {sent} bytes of it sent")
        assert took < 5, f"{took:.1f} s for a worker beside an oversize request"
        streamer.join(timeout=5)
        assert not streamer.is_alive(), "the oversize request was still being read"
        assert sent < 1 << 24
        assert process.poll() is None
    finally:
        oversize.close()


def test_a_flood_of_silent_connections_makes_room_for_a_client(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    process, address = server
    extra = 8
    flood = [_connect(address) for _ in range(MAX_PENDING + extra)]
    try:
        time.sleep(0.5)
        took = _worker_start_s(address, tmp_path, process.pid)
        print(f"worker start beside {len(flood)} silent connections: {took:.2f} s")
        assert took < 5, f"{took:.1f} s for a worker beside a flood of connections"
        # The oldest made room for the newer ones; the server's pending requests stay bounded.
        assert all(_closed_by_server(conn, 5) for conn in flood[:extra + 1])
        assert process.poll() is None
    finally:
        for conn in flood:
            conn.close()


def test_a_worker_holds_no_descriptor_of_another_clients_request(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    # A worker holding a copy of another client's stdout would hide that client's worker's death.
    _process, address = server
    read, write = os.pipe()
    waiting = _connect(address)  # its descriptors are in, its body is not
    socket.send_fds(waiting, [LENGTH.pack(1000)], [write] * 3)
    os.close(write)
    time.sleep(0.5)  # the server holds them when it forks
    client = _client(address, "import os, time; print(os.getpid(), flush=True); time.sleep(600)", tmp_path)
    try:
        assert client.stdout is not None
        worker = int(client.stdout.readline())
        pipe = f"pipe:[{os.fstat(read).st_ino}]"
        held = [fd.name for fd in Path(f"/proc/{worker}/fd").iterdir() if os.readlink(fd) == pipe]
        assert not held, f"the worker holds another client's descriptors: {held}"
    finally:
        client.kill()
        client.wait()
        waiting.close()
        os.close(read)


@pytest.mark.parametrize("request_bytes, fds", [
    (b"not json", 3),
    (json.dumps({"code": 1}).encode(), 3),
    (json.dumps({"code": "pass", "env": ["A=1"]}).encode(), 3),
    (json.dumps({"code": "pass", "env": {"A": 1}}).encode(), 3),
    (json.dumps({"code": "pass", "cwd": 7}).encode(), 3),
    (json.dumps({"code": "pass", "flags": "-u"}).encode(), 3),
    (json.dumps({"code": "pass"}).encode(), 2),
    (json.dumps({"code": "pass"}).encode(), 0),
    (b"[" * 100_000, 3),
], ids=["not-json", "code-not-text", "env-not-a-map", "env-value-not-text", "cwd-not-text", "flags-not-a-list",
        "two-descriptors", "no-descriptors", "nested-too-deep"])
def test_a_malformed_request_gets_no_worker(server: tuple[subprocess.Popen[bytes], str], request_bytes: bytes,
                                            fds: int, tmp_path: Path) -> None:
    process, address = server
    before = set(reaper._children_of(process.pid))
    conn = _connect(address)
    try:
        _send_header(conn, len(request_bytes), fds=fds)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused at its length already
            conn.sendall(request_bytes)
        assert _closed_by_server(conn, 5), "a malformed request was answered"
        assert set(reaper._children_of(process.pid)) <= before
        assert _worker_start_s(address, tmp_path, process.pid) < 30  # still serving, not ended by what it read
    finally:
        conn.close()
