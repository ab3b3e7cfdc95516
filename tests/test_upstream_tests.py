"""`repro upstream-tests`: a checkout's tests/pytorch/test_fusible_ops.py run against a target,
counted per target. The test file here is written for this test (TE's own is never copied): a
test on TE's own ops, one that skips the way upstream skips FP8 (TE itself says FP8 is
unavailable on the CPU backend), one that fails, and the device forms upstream uses: a
`torch.device` parametrization (ids device0, device1), a `device="cuda"` default, a test whose
helper puts its tensors on CUDA, and one given the CPU that calls CUDA anyway."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import repro

from harness import targets

TESTS = '''
import pytest
import torch
import transformer_engine.pytorch as te

def test_sequential_runs_tes_own_ops():
    model = te.ops.Sequential(te.ops.BasicLinear(8, 4, device="cpu"), te.ops.Bias(4, device="cpu"))
    assert model(torch.ones(2, 8)).shape == (2, 4)

def test_fp8_skips_like_upstream():
    available, reason = te.is_fp8_available(return_reason=True)
    if not available:
        pytest.skip(reason)

def test_fails_on_purpose():
    assert te.ops.Identity()(torch.ones(1)).item() == 2.0

@pytest.mark.parametrize("device", [torch.device("cpu"), torch.device("cuda")])
def test_bias_on(device):
    assert device.type == "cpu", "a cuda parametrization is deselected"
    assert te.ops.Bias(4, device=device)(torch.ones(2, 4)).shape == (2, 4)

def test_defaults_to_cuda(device="cuda"):
    raise AssertionError("deselected: its device is cuda")

def _helper(device="cuda"):
    return torch.ones(1, device=device)

def test_helper_goes_to_cuda():
    _helper()

def test_given_the_cpu_calls_cuda_anyway(device="cpu"):
    torch.ones(1).cuda()
'''


def _checkout(tmp_path: Path) -> Path:
    tests = tmp_path / "checkout" / "tests" / "pytorch"
    tests.mkdir(parents=True)
    (tests / "test_fusible_ops.py").write_text(TESTS)
    return tmp_path / "checkout"


def test_counts_per_target(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    result = repro("upstream-tests", "--tests", str(checkout), "--target", "te-2.13.0", "--target", "te-2.16.0",
                   check_rc=1)
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("te-")}
    # passed: the sequential and the cpu parametrization; failed: on purpose, and CUDA called where the CPU was
    # given; skipped: FP8, and the test whose helper went to CUDA; deselected: the cuda parametrization and default.
    assert rows == {"te-2.13.0": ["2", "2", "2", "FAILED"], "te-2.16.0": ["2", "2", "2", "FAILED"]}, result.stdout
    assert sorted(p.name for p in (checkout / "tests" / "pytorch").iterdir()) == ["test_fusible_ops.py"]


def test_a_target_on_which_nothing_passed_is_not_ok(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    (checkout / "tests" / "pytorch" / "test_fusible_ops.py").write_text(
        "import torch\n\ndef _helper(device='cuda'):\n    return torch.ones(1, device=device)\n\n"
        "def test_helper_goes_to_cuda():\n    _helper()\n")
    result = repro("upstream-tests", "--tests", str(checkout), "--target", "te-2.16.0", check_rc=1)
    row = next(line.split(maxsplit=4)[1:] for line in result.stdout.splitlines() if line.startswith("te-"))
    assert row == ["0", "0", "1", "nothing passed"], result.stdout


def test_without_a_tests_file_is_one_line_exit_2(tmp_path: Path) -> None:
    result = repro("upstream-tests", "--tests", str(tmp_path), "--target", "te-2.13.0", check_rc=2)
    assert len(result.stderr.strip().splitlines()) == 1 and "tests/pytorch/test_fusible_ops.py" in result.stderr


def test_a_revision_target_runs_that_revisions_tests(tmp_path: Path, cache: Path) -> None:
    """`--target path:DIR@REV` takes the tests of REV, not the work tree's, and leaves the checkout as it was."""
    from tests.forks import git

    checkout = _checkout(tmp_path)
    source = Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine"
    shutil.copytree(source, checkout / "transformer_engine", ignore=shutil.ignore_patterns("__pycache__"))
    git(checkout, "init", "-q", "-b", "main")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "tests with a failure")
    (checkout / "tests" / "pytorch" / "test_fusible_ops.py").write_text(TESTS.split("def test_fp8")[0])
    git(checkout, "commit", "-q", "-am", "only the passing test")
    result = repro("upstream-tests", "--target", f"path:{checkout}@HEAD~1", check_rc=1)
    row = next(line.split()[1:] for line in result.stdout.splitlines() if line.startswith("path:"))
    assert row == ["2", "2", "2", "FAILED"], result.stdout
    assert git(checkout, "status", "--porcelain") == ""
