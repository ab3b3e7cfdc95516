"""Device detection, including a real torch_npu that installs here but cannot load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, repro


def test_devices_explain_missing_accelerators() -> None:
    out = repro("devices", check_rc=0).stdout
    assert "cpu       available" in out
    assert "torch.cuda.is_available() is False" in out
    assert "npu       unavailable" in out


def test_installed_target_is_unavailable_with_reason() -> None:
    out = repro("targets", "installed", check_rc=0).stdout
    assert "unavailable: installed: no transformer_engine is importable" in out


@pytest.fixture(scope="module")
def npu_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway venv that sees this environment's packages, plus torch_npu."""
    venv = tmp_path_factory.mktemp("npu-venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "torch_npu==2.13.0"],
                             capture_output=True, text=True, check=False)
    if install.returncode != 0:
        pytest.skip(f"torch_npu could not be installed here: {install.stderr.strip().splitlines()[-1:]}")
    return venv


def test_broken_torch_npu_does_not_break_the_cpu_run(npu_venv: Path, tmp_path: Path) -> None:
    python = str(npu_venv / "bin/python")
    # As a user's shell would be: repro must protect itself, not rely on this test's environment.
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    bare = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, check=False, env=env)
    assert bare.returncode != 0 and "torch_npu" in bare.stderr  # the hazard is real in this venv
    devices = subprocess.run([python, "-m", "repro", "devices"], capture_output=True, text=True, cwd=REPO,
                             check=True, env=env)
    npu_line = next(line for line in devices.stdout.splitlines() if line.startswith("npu"))
    assert "unavailable" in npu_line and "libhccl.so" in npu_line
    run = subprocess.run([python, "-m", "repro", "run", "--matrix", "smoke", "--only", "pipeline=rmsnorm",
                          "--targets", "te-2.20.2", "--out", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, check=False, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "run.json").read_text())["results"]
    assert sum(r["outcome"] == "pass" for r in results) == 6
