"""The sandbox of the code under test (harness.runner.sandbox, harness.runner.seccomp): what a kernel
that refuses it gives, and the limits it sets. What a hostile tree tries from a run's worker is in
tests/test_hostile.py (TestTheSandboxHoldsTheTarget)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runner import sandbox
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(bool(sandbox.refusal()), reason=f"no sandbox here: {sandbox.refusal()}")


def _sandboxed(*argv: str, writable: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sandbox.DISABLE_ENV}
    return subprocess.run(sandbox.command(list(argv), writable), capture_output=True, text=True, cwd=REPO, env=env,
                          check=False)


def test_where_the_kernel_refuses_namespaces_target_code_runs_only_with_no_sandbox(cache: Path) -> None:
    """Inside a sandbox the filter refuses unshare: as a kernel without user namespaces would."""
    devices = _sandboxed(sys.executable, "-m", "repro", "devices")
    line, = [text for text in devices.stdout.splitlines() if text.startswith("sandbox:")]
    assert line.startswith("sandbox: refused by this kernel (unshare") and "--no-sandbox" in line, devices
    code = "import transformer_engine.pytorch"
    refused = _sandboxed(sys.executable, "-m", "repro", "exec", "--target", "te-2.16.0", "--", sys.executable, "-c", code)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused
    assert "refuses the sandbox" in refused.stderr and "--no-sandbox" in refused.stderr and "Traceback" not in refused.stderr
    allowed = _sandboxed(sys.executable, "-m", "repro", "exec", "--no-sandbox", "--target", "te-2.16.0", "--",
                         sys.executable, "-c", code, writable=(str(cache),))
    assert allowed.returncode == 0, allowed.stderr


def test_limits_and_filter_hold_in_the_sandbox() -> None:
    probe = ("import resource, os; print(resource.getrlimit(resource.RLIMIT_NPROC)[0], "
             "resource.getrlimit(resource.RLIMIT_FSIZE)[0], resource.getrlimit(resource.RLIMIT_CORE)[0], "
             "open('/proc/self/status').read().count('Seccomp:\\t2'), os.environ['TMPDIR'])")
    done = _sandboxed(sys.executable, "-c", probe)
    assert done.stdout.split() == [str(sandbox.PROCESSES), str(sandbox.FILE_BYTES), "0", "1", sandbox.PRIVATE_TMP], done


def test_a_writable_folder_is_the_only_one_besides_the_private_tmp(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    script = ("import sys; open(sys.argv[1] + '/open/x', 'w').write('ok')\n"
              "try:\n    open(sys.argv[1] + '/closed/x', 'w')\nexcept OSError as exc:\n    print(exc.strerror)\n")
    done = _sandboxed(sys.executable, "-c", script, str(tmp_path), writable=(str(tmp_path / "open"),))
    assert (tmp_path / "open/x").read_text() == "ok" and not (tmp_path / "closed/x").exists(), done
    assert done.stdout.strip() == "Read-only file system", done
