"""Workers through pytest-xdist's `--tx` specs: local popen workers, and workers over
ssh to an OpenSSH server this test starts on the loopback with a throwaway key (so the
session's case file and the harness travel by xdist's rsync, and the records come back
over xdist's channel). With no sshd on the machine the ssh test fails, never skips."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runner.rundir import session_name
from tests.conftest import REPO

SELECTION = ["--matrix", "smoke", "--only", "pipeline=rmsnorm", "--targets", "te-2.20.2"]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", "run", *SELECTION, "--out", str(out), *extra],
                          capture_output=True, text=True, cwd=REPO, check=False)


def _workers(out: Path) -> list[dict]:
    lines = (out / "sessions" / f"{session_name('te-2.20.2')}.startup.jsonl").read_text().splitlines()
    return list({entry["pid"]: entry for entry in map(json.loads, lines)}.values())


def test_popen_workers(tmp_path: Path) -> None:
    result = _run(tmp_path, "--tx", "2*popen")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["complete"] and len(run["results"]) == 6
    assert len(_workers(tmp_path)) == 2  # both workers ran cases


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def loopback_ssh(tmp_path: Path) -> Iterator[Path]:
    """An sshd on 127.0.0.1 with a throwaway host key and client key; yields the ssh
    config file that reaches it. Stopped afterwards."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).is_file() or not shutil.which("ssh-keygen"):
        pytest.fail("no OpenSSH server here (sshd); install openssh-server (as .ci/install does) to test --tx ssh")
    keys = tmp_path / "ssh"
    keys.mkdir(mode=0o700)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
    port = _free_port()
    (keys / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host_key'}\nAuthorizedKeysFile {keys / 'authorized_keys'}\n"
        f"PidFile {keys / 'sshd.pid'}\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin prohibit-password\n")
    (keys / "ssh_config").write_text(
        f"Host 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n  IdentityFile {keys / 'client_key'}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  BatchMode yes\n"
        "  LogLevel ERROR\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    server = subprocess.Popen([sshd, "-D", "-e", "-f", str(keys / "sshd_config")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and server.poll() is None:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"sshd did not start on 127.0.0.1:{port}: {server.stdout.read() if server.stdout else ''}")
        login = subprocess.run(["ssh", "-F", str(keys / "ssh_config"), "127.0.0.1", "true"], capture_output=True,
                               text=True, timeout=30, check=False)
        assert login.returncode == 0, f"cannot log in to the test's sshd: {login.stderr}"
        yield keys / "ssh_config"
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_ssh_workers_on_the_loopback(tmp_path: Path, loopback_ssh: Path) -> None:
    remote_dir = tmp_path / "remote"
    spec = f"2*ssh=127.0.0.1//ssh_config={loopback_ssh}//python={sys.executable}//chdir={remote_dir}"
    out = tmp_path / "run"
    result = _run(out, "--tx", spec)
    assert result.returncode == 0, result.stderr + (out / "sessions" / f"{session_name('te-2.20.2')}.log").read_text()[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and len(run["results"]) == 6
    assert {r["verdict"] for r in run["results"]} <= {"fixed", "unaffected"}
    workers = _workers(out)
    # The workers ran in the directory xdist copied the session and the harness to.
    assert workers and all(w["cwd"] == str(remote_dir) for w in workers)
    assert (remote_dir / "harness" / "runner" / "plugin.py").is_file()
    assert (remote_dir / "sessions" / f"{session_name('te-2.20.2')}.cases.json").is_file()


@pytest.mark.parametrize("args", [["--tx", "0*popen"], ["--tx", "ssh"], ["--tx", "telnet=host"],
                                  ["--rsyncdir", "/no/such/dir"]])
def test_bad_specs_are_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "out"
    result = _run(out, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and ("valid:" in lines[0] or "no such directory" in lines[0])
    assert not out.exists()
