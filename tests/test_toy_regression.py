"""A regression is one module and one patch: a toy one, with its own scenario, added to a
copy of the project (its module in cases/regressions/, its patch in patches/, nothing else
touched) runs through `python -m repro run` and is reproduced and fixed. Also the pieces a
regression declares: release ranges, fixed behaviours, its own axes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from cases.case import Case
from cases.regression import Prediction, Rule, Symptom
from cases.regressions import REGRESSIONS
from cases.releases import Releases
from harness import targets
from harness.model import Role, Verdict
from harness.runner.roles import release_role, role_of
from harness.runner.verdicts import verdict
from harness.targets import PreparedTarget, sources

REPO = Path(__file__).resolve().parent.parent

TOY = '''"""A toy regression: te.ops.Sequential lacks the `_toy_marker` its reference has."""

from typing import Any

import torch

from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases
from cases.scenario import Scenario, Steps, Trial


def _trial(case, target: Any) -> Trial:
    seen: dict[str, Any] = {}

    def test():
        module = target.ops["Sequential"](target.ops["Identity"]())
        seen["marker"] = getattr(module, "_toy_marker", None)
        return (module(torch.ones(2, 2) * float(case.scale)),)

    return Trial(test=Steps(test, observed=seen))


def _reference(case) -> Steps:
    return Steps(lambda: (torch.ones(2, 2) * float(case.scale),), observed={"marker": "present"})


REGRESSION = Regression(
    id="toy_marker",
    title="toy: Sequential has no _toy_marker",
    upstream="none (a test's toy)",
    affected=Releases(">=2.13.0"),
    patches=("toy_marker",),
    rules=(Rule("marker_missing", lambda case: True, Symptom("no marker", observed=r"marker: None"), "toy"),),
    exclude=lambda case: None,
    presets={"default": {"scale": ("1", "2")}},
    default_targets=("te-2.13.0", "te-2.13.0+toy_marker"),
    scenario=Scenario("toy_steps", "build Sequential(Identity), read a marker, call it", {"scale": ("1", "2")},
                      trial=_trial, reference=_reference),
)
'''


def _toy_patch(tmp: Path) -> str:
    """A real unified diff against te-2.13.0's sequential.py, made by git."""
    tree = Path(targets.prepare("te-2.13.0", sources.cache_dir()).root)
    before, after = tmp / "a" / "transformer_engine/pytorch/ops", tmp / "b" / "transformer_engine/pytorch/ops"
    before.mkdir(parents=True)
    after.mkdir(parents=True)
    text = (tree / "transformer_engine/pytorch/ops/sequential.py").read_text()
    (before / "sequential.py").write_text(text)
    marker = "class Sequential(torch.nn.Module):\n"
    assert marker in text
    (after / "sequential.py").write_text(text.replace(marker, marker + '    _toy_marker = "present"\n', 1))
    diff = subprocess.run(["git", "diff", "--no-index", "--no-prefix", "a", "b"], check=False, cwd=tmp, capture_output=True, text=True)
    assert diff.returncode == 1, diff.stderr
    return diff.stdout


def test_toy_regression_is_one_module_and_one_patch(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    for part in ("cases", "harness", "repro", "patches"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    (copy / "cases/regressions/toy_marker.py").write_text(TOY)
    (copy / "patches/toy_marker.patch").write_text(_toy_patch(tmp_path / "diff"))
    (copy / "patches/toy_marker.toml").write_text(
        'description = "toy: give Sequential its marker"\npatch = "toy_marker.patch"\nfixes = ["toy_marker"]\n')
    after = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert {p for p in after if after[p] != before.get(p)} == {
        Path("cases/regressions/toy_marker.py"), Path("patches/toy_marker.patch"), Path("patches/toy_marker.toml")}

    env = {**os.environ, "PYTHONPATH": str(copy)}
    listed = subprocess.run([sys.executable, "-m", "repro", "regressions"], check=False, cwd=copy, env=env,
                            capture_output=True, text=True)
    assert "toy_marker" in listed.stdout and ">=2.13.0" in listed.stdout, listed.stderr
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "repro", "run", "--matrix", "toy_marker", "--out", str(out), "-n", "1"],
                            check=False, cwd=copy, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    verdicts = {(r["target"], r["case_id"]): r["verdict"] for r in records}
    assert verdicts == {("te-2.13.0", "toy_marker:1"): "reproduced", ("te-2.13.0", "toy_marker:2"): "reproduced",
                        ("te-2.13.0+toy_marker", "toy_marker:1"): "fixed",
                        ("te-2.13.0+toy_marker", "toy_marker:2"): "fixed"}
    assert all(r["observations"]["marker"] == ("present" if "+" in r["target"] else None) for r in records)
    run = json.loads((out / "run.json").read_text())
    assert run["regressions"][0]["affected"] == ">=2.13.0" and run["regressions"][0]["axes"] == ["scale"]


def test_release_ranges_drive_roles() -> None:
    regression = REGRESSIONS["issue22"]
    assert str(regression.affected) == ">=2.6.0,<2.16.0"
    assert [release_role(regression, Version(v))[0] for v in ("2.5.0", "2.6.0", "2.15.0", "2.16.0")] == [
        Role.PREDATES, Role.UNPATCHED, Role.UNPATCHED, Role.FIXED_UPSTREAM]
    back_again = Releases("<2.16.1 || ==2.17.0")  # a fix in a patch release, lost in the next minor
    assert [back_again.contains(Version(v)) for v in ("2.16.0", "2.16.1", "2.17.0", "2.17.1")] == [
        True, False, True, False]
    assert back_again.observed_ranges(["2.15.0", "2.16.0", "2.16.1", "2.17.0", "2.17.1"]) == ["2.15.0..2.16.0", "2.17.0"]
    assert str(back_again.first_fixed()) == "2.16.1" and back_again.lower_bound() is None
    with pytest.raises(ValueError, match="bad release range"):
        Releases("<2.16 ||| x")


def test_declared_fixed_behaviour_and_any_other_failure() -> None:
    refusal = Symptom("refused", error_type="RuntimeError", message="Refusing to load")
    rule = Rule("r", lambda case: True, Symptom("ran", observed="payload_executed: True"), "why",
                fixed_behaviours=(refusal,))
    prediction = Prediction("affected", rule, "why")
    refused = {"outcome": "crash", "error": {"type": "RuntimeError", "message": "Refusing to load it"}, "details": {}}
    other = {"outcome": "crash", "error": {"type": "RuntimeError", "message": "something else"}, "details": {}}
    assert verdict(prediction, refused, Role.FIXED_UPSTREAM)[0] is Verdict.FIXED
    assert verdict(prediction, refused, Role.PATCHED)[0] is Verdict.FIXED
    assert verdict(prediction, refused, Role.UNKNOWN)[0] is Verdict.FIXED  # the sweep: a fixed release
    assert verdict(prediction, refused, Role.UNPATCHED)[0] is Verdict.UNEXPECTED_PASS
    assert verdict(prediction, other, Role.FIXED_UPSTREAM)[0] is Verdict.REGRESSION
    assert verdict(Prediction("affected", Rule("r", rule.applies, rule.symptom, "why"), "why"), refused,
                   Role.FIXED_UPSTREAM)[0] is Verdict.REGRESSION  # undeclared, a refusal is a failure


def test_own_axes_keep_ids_and_take_no_other_pipeline() -> None:
    case_id = "issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
    assert Case.from_id(case_id).case_id == case_id
    # issue22 names its own pipelines: the shared library's catalogue can grow without it.
    from cases import axes

    assert REGRESSIONS["issue22"].axes is not axes.AXES
    generated = [p for p in axes.AXES["pipeline"] if p.startswith("gen.")]
    assert generated and not set(generated) & set(REGRESSIONS["issue22"].axes["pipeline"])
    assert REGRESSIONS["issue22"].axes["pipeline"] == tuple(p for p in axes.AXES["pipeline"] if p not in generated)


def test_trial_puts_back_what_a_scenario_changed() -> None:
    """A scenario that leaves grad mode or the environment changed gets them put back, said in
    the record's note; the trial's own cleanup runs even when the target's steps raise."""
    from cases.scenario import Scenario, Steps, Trial
    from harness.engine.trial import run_trial

    cleaned: list[bool] = []

    def leaky(case: Case, target: object) -> Trial:
        def test() -> tuple:
            torch.set_grad_enabled(False)
            os.environ["TE_REPRO_TOY_LEAK"] = "1"
            raise RuntimeError("boom")

        return Trial(test=Steps(test), cleanup=lambda: cleaned.append(True))

    class Target:  # what run_trial reads of a loaded target
        te_dir = None
        prepared = types.SimpleNamespace(version="2.13.0")

    scenario = Scenario("leaky", "changes process state", {"x": ("1",)}, trial=leaky,
                        reference=lambda case: Steps(lambda: (torch.ones(1),)))
    record = run_trial(Case("issue22", *(values[0] for values in REGRESSIONS["issue22"].axes.values())), Target(),
                       scenario)
    assert torch.is_grad_enabled() and "TE_REPRO_TOY_LEAK" not in os.environ and cleaned == [True]
    assert record["outcome"] == "crash" and record["error"]["type"] == "RuntimeError"
    assert "grad mode False" in record["note"] and "TE_REPRO_TOY_LEAK" in record["note"]


def test_records_say_whether_a_standalone_reproducer_exists() -> None:
    from harness.runner.records import finish
    from repro import reports

    observed = {"outcome": "pass", "failed_checks": [], "details": {}, "error": None, "side_effects": [],
                "known_deviations": [], "note": None, "duration_s": 0.0}
    axes = {a: v[0] for a, v in REGRESSIONS["issue22"].axes.items()}
    ops = finish(Case("issue22", **axes), "te-2.13.0", Role.UNPATCHED, observed)
    block = finish(Case("issue22", **{**axes, "client": "megatron_block"}), "te-2.13.0", Role.UNPATCHED, observed)
    assert ops["standalone"] is True and ops["standalone_refusal"] is None
    assert block["standalone"] is False and "Megatron's own modules" in block["standalone_refusal"]
    assert "--standalone" in reports.show_command(ops["case_id"], "te-2.13.0", ops["standalone"])
    assert "--standalone" not in reports.show_command(block["case_id"], "te-2.13.0", block["standalone"])
    assert reports.reproduce_command(block["case_id"], "te-2.13.0", False).endswith("> case.py && python case.py")


def test_sweep_tells_the_api_missing_from_affected() -> None:
    from harness.runner.sweep import compare_ranges, release_row

    def record(version: str, outcome: str, verdict: str, note: str | None = None) -> dict:
        return {"target": f"te-{version}", "outcome": outcome, "verdict": verdict, "expected": "affected",
                "failed_checks": [], "note": note}

    results = [record("2.6.0", "not_applicable", "not_applicable", "te.pytorch has no quantized_model_init"),
               record("2.7.0", "crash", "reproduced"), record("2.10.0", "pass", "fixed")]
    rows = [release_row(v, results) for v in ("2.6.0", "2.7.0", "2.10.0")]
    assert [r["state"] for r in rows] == ["not applicable", "affected", "fixed"]
    assert rows[0]["reason"] == "te.pytorch has no quantized_model_init"
    agreed = compare_ranges(REGRESSIONS["quantize_model_init"], rows)  # declared >=2.7.0,<2.10.0
    assert agreed["observed"] == agreed["declared_over_swept"] == ["2.7.0"] and agreed["not_applicable"] == ["2.6.0"]
    assert agreed["disagree"] == []
    wider = compare_ranges(REGRESSIONS["issue22"], rows)  # declared >=2.6.0,<2.16.0
    assert wider["declared_over_swept"] == ["2.6.0..2.10.0"]
    assert wider["disagree"] == ["2.10.0 (declared affected, observed fixed)",
                                 "2.6.0 (declared affected, not applicable: te.pytorch has no quantized_model_init)"]


def _tree_with_version(version: str) -> PreparedTarget:
    """A tree without a fix marker (no root to look in), reading `version`."""
    return PreparedTarget(spec="path:fork", kind="path", source="path: fork", root=None, version=version,
                          fuser_sha="", patch=None, patch_status="none", patch_detail="", backend="cpu")


def test_a_version_between_releases_decides_only_where_its_number_settles_it() -> None:
    """2.16.0.dev0 (any commit after 2.15 on the way to 2.16.0) and a fork's 2.14.0+npu say
    nothing near a bound of the affected range; far from one they stand for their release."""
    issue22, saved_twice = REGRESSIONS["issue22"], REGRESSIONS["saved_tensors_twice"]
    assert str(issue22.affected) == ">=2.6.0,<2.16.0" and str(saved_twice.affected) == "<2.5.0"
    roles = {(r.id, v): role_of(r, _tree_with_version(v))[0] for r in (issue22, saved_twice)
             for v in ("2.16.0.dev0", "2.6.0.dev0", "2.10.0.dev0", "2.17.0.dev0", "2.14.0+npu", "2.16.0rc1+npu")}
    assert roles == {
        ("issue22", "2.16.0.dev0"): Role.UNKNOWN, ("issue22", "2.6.0.dev0"): Role.UNKNOWN,  # the fix or the bug lands in it
        ("issue22", "2.10.0.dev0"): Role.UNPATCHED, ("issue22", "2.17.0.dev0"): Role.FIXED_UPSTREAM,
        ("issue22", "2.14.0+npu"): Role.UNKNOWN,  # a fork of an affected release may carry a fix no marker knows
        ("issue22", "2.16.0rc1+npu"): Role.UNKNOWN,
        **{("saved_tensors_twice", v): Role.FIXED_UPSTREAM
           for v in ("2.16.0.dev0", "2.6.0.dev0", "2.10.0.dev0", "2.17.0.dev0", "2.14.0+npu", "2.16.0rc1+npu")},
    }
    assert Releases("<2.16.1 || ==2.17.0").settles(Version("2.17.0.dev0")) is False
    assert Releases("<2.16.1 || ==2.17.0").settles(Version("2.18.0.dev0")) is True


def test_a_rules_symptom_can_be_declared_per_release_range() -> None:
    """The same bug raising another message from 2.18 on: each release is judged against its own form."""
    from cases.regression import Regression, Rule, Symptom
    from harness.runner.verdicts import verdict

    old, new = Symptom("old message", message="old"), Symptom("new message", message="new")
    rule = Rule("r", lambda case: True, old, "why", symptom_by_release=((Releases(">=2.18"), new),))
    regression = Regression("toy_by_release", "t", "u", Releases("<3"), (), (rule,), lambda case: None,
                            {"default": {}}, (), own_axes={})
    case = Case("toy_by_release")
    assert regression.predict(case, "2.13.0").rule.symptom is old
    assert regression.predict(case, "2.18.0").rule.symptom is new
    assert regression.predict(case, "not-a-version").rule.symptom is old
    seen_new = {"outcome": "crash", "error": {"type": "E", "message": "new", "location": None}}
    assert verdict(regression.predict(case, "2.18.0"), seen_new, Role.UNPATCHED)[0] is Verdict.REPRODUCED
    # On a release before the range, the new form is not this rule's prediction there.
    assert verdict(regression.predict(case, "2.13.0"), seen_new, Role.UNPATCHED)[0] is Verdict.OTHER_FAILURE
    assert new in rule.symptoms  # another regression's case still attributes either form to this bug


def test_a_fusion_a_case_registers_is_named_and_taken_back(loaded_target) -> None:
    """TE's register_forward_fusion extends a class-level list: a case that leaves a pass registered
    would fuse every later case of the worker. The worker's guard names it and takes it back."""
    from transformer_engine.pytorch.ops import fuser

    from harness.runner import state

    before = list(fuser.OperationFuser.forward_fusion_functions)
    with state.guarded():  # the baseline: as the target loaded them
        pass

    def leftover_pass(ops, **kwargs):
        return ops

    with state.guarded() as changed:
        fuser.register_forward_fusion(leftover_pass)
    assert fuser.OperationFuser.forward_fusion_functions == before
    assert any("forward_fusion_functions: added " in c and "leftover_pass" in c for c in changed), changed
    with state.guarded() as changed:
        pass
    assert changed == []
