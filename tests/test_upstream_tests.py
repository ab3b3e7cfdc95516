"""`repro upstream-tests`: a checkout's tests/pytorch/test_fusible_ops.py run against a target,
counted per target. The test file here is written for this test (TE's own is never copied): a
test on TE's own ops, one that skips the way upstream skips FP8 (TE itself says FP8 is
unavailable on the CPU backend), one that fails, and the device forms upstream uses: a
`torch.device` parametrization (ids device0, device1), a `device="cuda"` default (placed on the
CPU), a test whose helper puts its tensors on CUDA, and one given the CPU that calls CUDA
anyway; and a checkout's CI script, whose environment for the test file is applied."""

from __future__ import annotations

import re
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

def test_defaults_to_cuda_is_placed_on_the_cpu(device="cuda"):
    assert device == "cpu"
    assert te.ops.Bias(4, device=device)(torch.ones(2, 4, device=device)).shape == (2, 4)

def test_placed_on_the_cpu_and_calls_cuda_anyway(device="cuda"):
    torch.ones(1, device="cuda")

def test_upstream_ci_environment():
    import os
    assert os.environ.get("NVTE_UPSTREAM_CI_SETS") == "1"

def test_autocast_refused_on_the_cpu(device="cuda"):
    with torch.autocast(device, dtype=torch.float32):
        y = te.ops.Bias(4, device=device, dtype=torch.float16)(torch.ones(2, 4, dtype=torch.float16))
    assert y.dtype == torch.float32

def _helper(device="cuda"):
    return torch.ones(1, device=device)

def test_helper_goes_to_cuda():
    _helper()

def test_given_the_cpu_calls_cuda_anyway(device="cpu"):
    torch.ones(1).cuda()
'''


CI_SCRIPT = """set -x
NVTE_OTHER=1 python3 -m pytest $TE_PATH/tests/pytorch/test_sanity.py || test_fail "test_sanity.py"
NVTE_UPSTREAM_CI_SETS=1 python3 -m pytest --junitxml=$XML_LOG_DIR/x.xml $TE_PATH/tests/pytorch/test_fusible_ops.py || test_fail "x"
NVTE_OTHER=2 python3 -m pytest $TE_PATH/tests/pytorch/distributed/test_fusible_ops.py || test_fail "y"
"""


def _checkout(tmp_path: Path) -> Path:
    tests = tmp_path / "checkout" / "tests" / "pytorch"
    tests.mkdir(parents=True)
    (tests / "test_fusible_ops.py").write_text(TESTS)
    qa = tmp_path / "checkout" / "qa" / "L0_pytorch_unittest"
    qa.mkdir(parents=True)
    (qa / "test.sh").write_text(CI_SCRIPT)
    return tmp_path / "checkout"


def test_counts_per_target(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    result = repro("upstream-tests", "--tests", str(checkout), "--target", "te-2.13.0", "--target", "te-2.16.0",
                   check_rc=1)
    table, rest = result.stdout.split("failures, each explained:")
    explained, skips = rest.split("skipped, by reason:")
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line.startswith("te-")}
    # passed: the sequential, the cpu parametrization, the cuda default placed on the CPU and the CI environment;
    # failed: on purpose, CUDA called where the CPU was given or placed, and the autocast the CPU refuses; skipped:
    # FP8, and the test whose helper went to CUDA; deselected: the cuda parametrization.
    assert rows == {t: ["4", "4", "2", "50.0%", "FAILED"] for t in ("te-2.13.0", "te-2.16.0")}, result.stdout
    assert "upstream CI environment: NVTE_UPSTREAM_CI_SETS=1 (qa/L0_pytorch_unittest/test.sh:3)" in table
    explained_rows = [re.split(r"\s{2,}", line) for line in explained.strip().splitlines()[2:]]
    autocast = ("CPU autocast: torch's CPU autocast refused the test's dtype (In CPU autocast, but the target dtype "
                "is not supported. Disabling autocast.)")
    assert sorted((row[0], row[1], row[2]) for row in explained_rows) == sorted(
        (target, why, n) for target in ("te-2.13.0", "te-2.16.0") for why, n in [
            ("device call: the test reached CUDA where it asked for the CPU", "2"), (autocast, "1"),
            ("difference: AssertionError: assert 1.0 == 2.0", "1")]), explained
    skip_rows = [re.split(r"\s{2,}", line) for line in skips.strip().splitlines()[2:]]
    assert {(row[0], row[2]) for row in skip_rows} == {("te-2.13.0", "1"), ("te-2.16.0", "1")} and len(skip_rows) == 4
    assert any(row[1].startswith("needs CUDA: the test takes no device") for row in skip_rows), skips
    assert sorted(p.name for p in (checkout / "tests" / "pytorch").iterdir()) == ["test_fusible_ops.py"]


def test_a_target_on_which_nothing_passed_is_not_ok(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    (checkout / "tests" / "pytorch" / "test_fusible_ops.py").write_text(
        "import torch\n\ndef _helper(device='cuda'):\n    return torch.ones(1, device=device)\n\n"
        "def test_helper_goes_to_cuda():\n    _helper()\n")
    result = repro("upstream-tests", "--tests", str(checkout), "--target", "te-2.16.0", check_rc=1)
    row = next(line.split(maxsplit=5)[1:] for line in result.stdout.splitlines() if line.startswith("te-"))
    assert row == ["0", "0", "1", "-", "nothing passed"], result.stdout


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
    assert row == ["4", "4", "2", "50.0%", "FAILED"], result.stdout
    assert "NVTE_UPSTREAM_CI_SETS=1" in result.stdout  # the CI script exported with the revision's tests
    assert git(checkout, "status", "--porcelain") == ""
