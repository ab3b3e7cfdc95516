"""`repro upstream-tests`' pure parts: the one-line reason of a failure (read from what pytest
wrote), and the environment upstream's CI script gives the fuser tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner.upstream_ci import ci_environment
from harness.runner.upstream_failures import Failure, by_reason, explain, failures, skips

MISSING = ("harness.targets.cpu_backend.extension.MissingKernel: target te-2.13.0: "
           "transformer_engine/pytorch/ops/basic/dropout.py:61 in op_forward called the compiled kernel "
           "transformer_engine_torch.{}, which has no CPU stand-in")

AUTOCAST_WARNING = ("In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                    "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently.")


@pytest.mark.parametrize("message, text, warnings, reason", [
    (MISSING.format("dropout_fwd"), "", [], ("missing kernel: transformer_engine_torch.dropout_fwd has no CPU "
                                             "stand-in (called at transformer_engine/pytorch/ops/basic/dropout.py:61)")),
    (MISSING.format("quantize"), "", [], ("needs FP8: transformer_engine_torch.quantize has no CPU stand-in "
                                          "(called at transformer_engine/pytorch/ops/basic/dropout.py:61)")),
    ("AssertionError: Torch not compiled with CUDA enabled", "", [],
     "device call: the test reached CUDA where it asked for the CPU"),
    ("assert torch.float16 == torch.float32", "", [AUTOCAST_WARNING],
     ("CPU autocast: torch's CPU autocast refused the test's dtype (In CPU autocast, but the target dtype is not "
      "supported. Disabling autocast.)")),
    ("AssertionError: Tensor-likes are not close!", "E Mismatched elements: 1 / 64 (1.6%)\nE Greatest", [],
     "tolerance: values beyond upstream's tolerance (Mismatched elements: 1 / 64 (1.6%))"),
    ("assert torch.float16 == torch.float32", "", ["an unrelated warning"],
     "difference: assert torch.float16 == torch.float32"),
    ("", "", [], "difference: (no message)"),
])
def test_each_failure_has_its_reason(message: str, text: str, warnings: list[str], reason: str) -> None:
    assert explain(message, text, warnings) == reason


def test_failures_read_from_junit_and_grouped(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite tests="4">'
        '<testcase classname="tests.pytorch.test_fusible_ops.TestFuser" name="test_a[x]">'
        f'<failure message="{MISSING.format("dropout_fwd")}">trace</failure></testcase>'
        '<testcase classname="tests.pytorch.test_fusible_ops.TestFuser" name="test_b">'
        f'<error message="{MISSING.format("dropout_bwd")}">trace</error></testcase>'
        '<testcase classname="tests.pytorch.test_fusible_ops.TestFuser" name="test_c">'
        f'<failure message="{MISSING.format("dropout_fwd")}">trace</failure></testcase>'
        '<testcase classname="tests.pytorch.test_fusible_ops.TestFuser" name="test_ok"/>'
        '</testsuite></testsuites>')
    found = failures(junit)
    assert [f.test for f in found] == ["TestFuser::test_a[x]", "TestFuser::test_b", "TestFuser::test_c"]
    assert [(n, test) for _, n, test in by_reason(found)] == [(2, "TestFuser::test_a[x]"), (1, "TestFuser::test_b")]
    assert by_reason([]) == [] and isinstance(found[0], Failure)


SCRIPT = """pip3 install pytest==8.2.1 || error_exit "x"
NVTE_A=1 python3 -m pytest $TE_PATH/tests/pytorch/test_sanity.py || test_fail "test_sanity.py"
python3 -m pytest $TE_PATH/tests/pytorch/test_fusible_ops_extra.py || test_fail "other"
NVTE_B=2 python3 -m pytest $TE_PATH/tests/pytorch/distributed/test_fusible_ops.py || test_fail "d"
NVTE_GROUPED_LINEAR_SINGLE_PARAM=1 NVTE_C='a b' python3 -m pytest --tb=auto $TE_PATH/tests/pytorch/test_fusible_ops.py || test_fail "f"
"""


def test_ci_environment_is_the_fuser_tests_line(tmp_path: Path) -> None:
    script = tmp_path / "test.sh"
    script.write_text(SCRIPT)
    assert ci_environment(script) == ({"NVTE_GROUPED_LINEAR_SINGLE_PARAM": "1", "NVTE_C": "a b"},
                                      "qa/L0_pytorch_unittest/test.sh:5")
    script.write_text(SCRIPT.splitlines()[0] + "\npython3 -m pytest $TE_PATH/tests/pytorch/test_fusible_ops.py\n")
    assert ci_environment(script) == ({}, "qa/L0_pytorch_unittest/test.sh:2")
    script.write_text("\n".join(SCRIPT.splitlines()[:4]))
    assert ci_environment(script) == ({}, "qa/L0_pytorch_unittest/test.sh does not run tests/pytorch/test_fusible_ops.py")
    assert ci_environment(tmp_path / "absent.sh") == ({}, "no qa/L0_pytorch_unittest/test.sh in the checkout")


def test_skips_keep_their_reason(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuite tests="3">'
        '<testcase classname="t.TestA" name="x"><skipped message="Quantization is only supported on CUDA devices"/>'
        '</testcase><testcase classname="t.TestA" name="y"><skipped message="Skipped: needs CUDA: the test"/>'
        '</testcase><testcase classname="t.TestA" name="z"/></testsuite>')
    assert [(f.test, f.reason) for f in skips(junit)] == [
        ("TestA::x", "Quantization is only supported on CUDA devices"), ("TestA::y", "needs CUDA: the test")]


def test_review_judges_upstream_tests_that_changed() -> None:
    from harness.runner.upstream_diff import changes, judged

    base = {"A::same": "passed", "A::broke": "passed", "A::fp8": "passed", "A::fixed": "failed",
            "A::gone": "passed", "A::skips_now": "passed"}
    head = {"A::same": "passed", "A::broke": "failed", "A::fp8": "failed", "A::fixed": "passed",
            "A::skips_now": "skipped", "A::new_fails": "failed"}
    why = {"A::broke": "difference: AssertionError", "A::fp8": "needs FP8: transformer_engine_torch.quantize ...",
           "A::new_fails": "tolerance: values beyond upstream's tolerance"}
    found = changes(base, head, why)
    assert [(c["test"], c["base"], c["head"], c["why"]) for c in found] == [
        ("A::broke", "passed", "failed", "difference: AssertionError"), ("A::fixed", "failed", "passed", ""),
        ("A::fp8", "passed", "failed", "needs FP8: transformer_engine_torch.quantize ..."),
        ("A::gone", "passed", "absent", ""),
        ("A::new_fails", "absent", "failed", "tolerance: values beyond upstream's tolerance"),
        ("A::skips_now", "passed", "skipped", "")]
    reasons, warnings = judged(found)
    assert reasons == [("2 of upstream's fuser tests fail at head and did not at base "
                        "(e.g. A::broke: difference: AssertionError)")]
    assert warnings == [
        ("1 of upstream's fuser tests fail at head and did not at base, on what the CPU backend lacks "
         "(e.g. A::fp8: needs FP8: transformer_engine_torch.quantize ...)"),
        "2 of upstream's fuser tests passed at base and do not run at head (e.g. A::gone: absent)"]
    assert judged(changes(base, base, {})) == ([], [])


def test_a_side_without_comparable_results_fails_the_review() -> None:
    """Lost or empty runs are never compared into a pass: head without results, a run that ended in pytest's
    internal error, and a side on which nothing passed each fail; two complete runs do not."""
    from harness.runner.upstream_diff import changes, judged, unjudged

    ran = {"passed": 2, "failed": 0, "skipped": 0}
    lost = {"base": ran, "head": {}, "status": {"base": 0, "head": 3}, "changes": []}
    assert unjudged(lost) == ["upstream's fuser tests gave no results on head (pytest exit 3)"]
    # What the review made of it before: base's tests "do not run at head", only a warning.
    assert judged(changes({"A::t": "passed"}, {}, {}))[0] == []
    crashed = {**lost, "head": ran, "status": {"base": 0, "head": 3}}
    assert unjudged(crashed) == ["upstream's fuser tests on head ended with pytest exit 3"]
    skipped = {**lost, "head": {"passed": 0, "failed": 0, "skipped": 5}, "status": {"base": 0, "head": 0}}
    assert unjudged(skipped) == ["none of upstream's fuser tests passed on head: nothing to compare"]
    assert unjudged({**lost, "head": ran, "status": {"base": 0, "head": 1}}) == []
