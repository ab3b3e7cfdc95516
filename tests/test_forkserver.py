"""The run's fork server (harness.runner.forkserver) and its client: a worker forked with torch
already imported, that still behaves as the `python -c CODE` xdist would have started, and ends
with whoever asked for it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runner import reaper
from harness.runner.forkserver import ADDRESS_ENV
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
def server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    process, address = _start_server()
    yield process, address
    process.terminate()
    process.wait(timeout=30)


def _client(address: str | None, code: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
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
