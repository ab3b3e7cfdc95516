"""Every failure named by what it is, and nothing judged is never a pass (issue 23): a failure
that is another catalogue regression's symptom is that regression's, by name; a regression none
of whose cases was judged fails the run; a not-applicable case on a tree that holds an op of no
upstream name is not judged, with the `[renamed_ops]` line to add; changes are classified by
signature."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cases.case import Case
from cases.regressions import REGRESSIONS
from harness.model import Role, Verdict
from harness.runner.status import summarize, unjudged
from harness.runner.verdicts import judge, known_bugs
from repro import diff
from tests.conftest import repro

ISSUE22_CRASH = {"outcome": "crash", "failed_checks": ["completion"], "details": {}, "side_effects": [],
                 "error": {"type": "RuntimeError", "location": "transformer_engine/pytorch/ops/fuser.py:148",
                           "message": "you can only change requires_grad flags of leaf variables."}}
# Unaffected by saved_tensors_twice (a reentrant checkpoint counts no unpacks), affected by issue 22.
SAVED_CASE = Case.from_id("saved_tensors_twice:ops-fused_residual_rmsnorm-enabled-non_leaf-trainable-"
                          "checkpoint_reentrant-single-dense-float32-cpu")


def _judged(roles: dict[str, str]) -> Any:
    saved = REGRESSIONS["saved_tensors_twice"]
    return judge(saved.predict(SAVED_CASE), ISSUE22_CRASH, Role.FIXED_UPSTREAM,
                 known_bugs(REGRESSIONS, roles, saved.id))


def test_another_regressions_symptom_is_named_never_a_regression_of_this_one() -> None:
    found = _judged({"issue22": "unpatched"})
    assert found.verdict is Verdict.KNOWN_BUG and found.attributed_to == "issue22"
    assert "issue22's symptom" in found.reason
    back = _judged({"issue22": "fixed_upstream"})  # on a tree fixed for issue 22: it came back, by name
    assert back.verdict is Verdict.REGRESSION and back.attributed_to == "issue22" and "came back" in back.reason
    alone = judge(REGRESSIONS["saved_tensors_twice"].predict(SAVED_CASE), ISSUE22_CRASH, Role.FIXED_UPSTREAM)
    assert alone.verdict is Verdict.REGRESSION and alone.attributed_to is None  # the judge without the catalogue


def test_the_own_symptom_comes_first_and_is_recorded() -> None:
    case = Case.from_id("issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu")
    issue22 = REGRESSIONS["issue22"]
    crash = {**ISSUE22_CRASH, "error": {**ISSUE22_CRASH["error"], "location": "transformer_engine/pytorch/ops/fuser.py:141"}}
    found = judge(issue22.predict(case), crash, Role.UNPATCHED, known_bugs(REGRESSIONS, {}, "issue22"))
    assert found.verdict is Verdict.REPRODUCED and found.symptom and found.attributed_to is None
    fixed = judge(issue22.predict(case), crash, Role.FIXED_UPSTREAM, known_bugs(REGRESSIONS, {}, "issue22"))
    assert fixed.verdict is Verdict.REGRESSION and fixed.symptom  # the bug back on a fixed tree


def test_a_run_of_another_regression_names_issue22_on_a_release_that_has_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = repro("run", "--matrix", "saved_tensors_twice", "--targets", "te-2.9.0", "--only",
                   "pipeline=fused_residual_rmsnorm", "--only", "dtype=float32", "-n", "1", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    run = json.loads((out / "run.json").read_text())
    verdicts = {(r["verdict"], r.get("attributed_to")) for r in run["results"]}
    assert ("known_bug", "issue22") in verdicts and not any(v == "regression" for v, _ in verdicts), verdicts
    report = (out / "report.md").read_text()
    assert "failed with another catalogue regression's symptom" in report and "issue22" in report


def _run_of(records: list[dict[str, Any]], roles: dict[str, str]) -> dict[str, Any]:
    return {"environment": {"targets": [{"spec": "t", "roles": roles}]}, "results": records, "complete": True,
            "missing": 0}


def test_a_regression_none_of_whose_cases_was_judged_fails_the_run() -> None:
    not_applicable = [{"target": "t", "regression": "issue22", "case_id": f"issue22:c{n}", "outcome": "not_applicable",
                       "verdict": "not_applicable", "verdict_reason": "t lacks MakeExtraOutput"} for n in range(3)]
    run = _run_of(not_applicable, {"issue22": "unpatched"})
    summary = summarize(run)
    assert summary["status"] == "FAIL" and summary["needs_attention"] == 0
    assert summary["fail_reasons"] == [("issue22 could not be judged on t: none of its 3 cases was judged"
                                        " (t lacks MakeExtraOutput)")]
    assert unjudged(_run_of(not_applicable, {"issue22": "predates"})) == []  # a release before the bug
    judged = [*not_applicable, {**not_applicable[0], "case_id": "issue22:c9", "outcome": "pass", "verdict": "fixed"}]
    assert summarize(_run_of(judged, {"issue22": "unpatched"}))["status"] == "PASS"


def _renamed_op_tree(root: Path, cache: Path) -> Path:
    """te-2.13.0 with MakeExtraOutput renamed (file and class), as a fork might."""
    from harness import targets

    source = Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine"
    shutil.copytree(source, root / "transformer_engine", ignore=shutil.ignore_patterns("__pycache__"))
    ops = root / "transformer_engine/pytorch/ops"
    (ops / "basic/make_extra_output.py").rename(ops / "basic/extra_output_npu.py")
    for path in ops.rglob("*.py"):
        text = path.read_text()
        if "MakeExtraOutput" in text or "make_extra_output" in text:
            path.write_text(text.replace("make_extra_output", "extra_output_npu").replace("MakeExtraOutput",
                                                                                            "ExtraOutputNPU"))
    return root


NARROW = ["--matrix", "issue22", "--only", "client=ops", "--only", "pipeline=extra_output_only,rmsnorm", "--only",
          "dtype=float32", "--only", "recompute=none", "--only", "sequence=single", "-n", "1"]


def test_a_renamed_op_is_not_judged_and_the_fork_config_line_is_offered(tmp_path: Path, cache: Path) -> None:
    tree = _renamed_op_tree(tmp_path / "fork", cache)
    out = tmp_path / "run"
    result = repro("run", *NARROW, "--targets", f"path:{tree}", "--out", str(out), check_rc=1)
    line = '[renamed_ops] MakeExtraOutput = "extra_output_npu:ExtraOutputNPU"'
    assert line in result.stdout and "not_judged" in result.stdout, result.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["status"] == "FAIL" and run["summary"]["verdicts"]["not_judged"] > 0
    config = tmp_path / "fork.toml"
    config.write_text(line.replace("] ", "]\n") + "\n")
    fixed = repro("run", *NARROW, "--targets", f"path:{tree}", "--fork-config", str(config), "--out",
                  str(tmp_path / "again"), check_rc=0)
    assert "not_judged" not in fixed.stdout


@pytest.mark.parametrize("before, after, kind", [
    ("pass", "crash", "new failure"),
    ("crash", "pass", "newly fixed"),
    ("crash", "crash-other", "changed failure"),
    ("pass", "not_applicable", "stopped running"),
    ("crash", "not_applicable", "stopped running"),
    ("not_applicable", "pass", "started running"),
    ("not_applicable", "crash", "new failure"),
])
def test_changes_are_classified_by_signature(before: str, after: str, kind: str) -> None:
    def record(state: str) -> dict[str, Any]:
        if state.startswith("crash"):
            error_type = "ValueError" if state == "crash-other" else "RuntimeError"
            return {"outcome": "crash", "verdict": "reproduced", "failed_checks": ["completion"],
                    "error": {"type": error_type, "location": "transformer_engine/pytorch/ops/fuser.py:141"}}
        return {"outcome": state, "verdict": "fixed" if state == "pass" else state, "failed_checks": [], "error": None}

    assert diff.kind_of(record(before), record(after)) == kind


@pytest.mark.parametrize("leaf", ["leaf", "detached"])  # a detached tensor is a leaf the fuser marks too
def test_a_deviation_holds_only_on_the_releases_where_it_was_seen(leaf: str) -> None:
    from cases.deviations import MARKS_CALLER_INPUT, split_known

    case = Case.from_id(f"issue22:ops-rmsnorm-enabled-{leaf}-trainable-none-single-dense-float32-cpu")
    failed = {"caller_tensors": ["caller's x.requires_grad: False -> True, reference -> False"]}
    explained = f"{failed['caller_tensors'][0]} [{MARKS_CALLER_INPUT.why}]"
    assert split_known(case, (MARKS_CALLER_INPUT,), failed, "2.6.0") == ({}, [explained])
    assert split_known(case, (MARKS_CALLER_INPUT,), failed, "2.16.0") == (failed, [])  # back in a later release
    assert split_known(case, (MARKS_CALLER_INPUT,), failed, "unknown") == (failed, [])



def test_issue22_masked_by_the_fuser_marking_its_input_again_is_still_issue22() -> None:
    # te-2.6.0, seen in `repro run --matrix all --targets te-2.6.0`: the no-grad step clears the
    # caller's flag (issue 22); the next forward sets it again after building its graph (the
    # MARKS_CALLER_INPUT deviation), so the flag ends as it began and x gets no gradient.
    case = Case.from_id("issue22:ops-residual_mlp-enabled-leaf_requires_grad-trainable-none-recompute_pattern-"
                        "dense-float32-cpu")
    observed = {"outcome": "wrong_grad", "failed_checks": ["gradients"], "error": None, "side_effects": [],
                "details": {"gradients": ["grad of x: missing, reference present"]}}
    issue22 = REGRESSIONS["issue22"]
    found = judge(issue22.predict(case), observed, Role.UNPATCHED, known_bugs(REGRESSIONS, {}, "issue22"))
    assert found.verdict is Verdict.REPRODUCED and found.symptom
    assert "marks the caller's input" in found.reason
    other = {**observed, "details": {"gradients": ["grad of weight: max abs diff 0.5"]}}
    assert judge(issue22.predict(case), other, Role.UNPATCHED).verdict is Verdict.OTHER_FAILURE

def test_a_tree_without_a_version_file_says_why_once_and_takes_one_from_its_config(tmp_path: Path,
                                                                                   cache: Path) -> None:
    from harness import targets

    tree = tmp_path / "tree"
    shutil.copytree(Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine",
                    tree / "transformer_engine", ignore=shutil.ignore_patterns("__pycache__"))
    megatron = ["--matrix", "issue22", "--only", "client=megatron_norm", "--only", "dtype=float32", "--only",
                "pipeline=fused_residual_rmsnorm", "--only", "input=non_leaf", "--only", "recompute=none,megatron",
                "-n", "1", "--targets", f"path:{tree}"]
    result = repro("run", *megatron, "--out", str(tmp_path / "a"), check_rc=1)
    cause = 'this tree has none (no VERSION.txt or dist-info); give it one in the fork config: version = "X.Y.Z"'
    assert f"HARNESS ERROR on path:{tree}: " in result.stdout and cause in result.stdout, result.stdout
    assert cause in (tmp_path / "a" / "report.md").read_text()
    config = tmp_path / "fork.toml"
    config.write_text('version = "2.13.0"\n')
    repro("run", *megatron, "--fork-config", str(config), "--out", str(tmp_path / "b"), check_rc=0)
