"""The Megatron clients as cases of the matrix: generation with exclusions by reason, the rules
that predict them, a run through the real runner on the unpatched, patched and fixed releases,
and the frame table in the reports.

The run tests go through `repro run` (one pytest session per target, Megatron imported only by
the processes that run Megatron cases). The broken-kernel tests run in this process, on the one
target it holds (te-2.20.2, tests/conftest.py), with TE's RMSNorm kernel stand-in perturbed.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from cases.case import Case
from cases.matrix import select
from cases.regressions import REGRESSIONS
from harness.megatron import frames
from harness.model import Role
from harness.runner.verdicts import verdict
from repro import render_md
from tests.conftest import repro

REPORT = Path(__file__).resolve().parent / "fixtures" / "issue-22-traceback.txt"
ISSUE22 = REGRESSIONS["issue22"]
RUN_TARGETS = ("te-2.13.0", "te-2.13.0+backport", "te-2.16.0")
# A handful: the report's scenario (full/block, non-leaf), full/uniform, the block's control, and
# Megatron's norm under Megatron's checkpoint and called directly.
RUN_ONLY = ["client=megatron_block,megatron_norm", "recompute=none,megatron,full_block,full_uniform",
            "input=non_leaf", "params=trainable", "dtype=float32", "grad_mode=enabled", "sequence=single"]
REPORT_CASE = "issue22:megatron_block-fused_residual_rmsnorm-enabled-non_leaf-trainable-full_block-single-dense-float32-cpu"


def block_case(**axes: str) -> Case:
    values = {"regression": "issue22", "client": "megatron_block", "pipeline": "fused_residual_rmsnorm",
              "grad_mode": "enabled", "input": "non_leaf", "params": "trainable", "recompute": "full_block",
              "sequence": "single", "grad_form": "dense", "dtype": "float32", "device": "cpu"}
    return Case(**{**values, **axes})


def test_matrix_has_the_megatron_cases_and_counts_exclusions() -> None:
    selection = select(ISSUE22, "default")
    clients = Counter(case.client for case in selection.cases)
    # megatron_norm: recompute none (4 grad modes, plus recompute_pattern) and the 3 wrappers (grad
    # enabled), each x 5 inputs x 2 params x 2 dtypes: (5 + 3) * 20.
    assert clients["megatron_norm"] == 160
    # megatron_block: recompute none as megatron_norm's, less view under inference_mode: (5 * 5 - 1) * 4;
    # full_block and full_uniform on the 3 inputs that require grad: 2 * 3 * 4.
    assert clients["megatron_block"] == 96 + 24
    by_client = {c: {case.recompute for case in selection.cases if case.client == c} for c in clients}
    assert by_client["megatron_block"] == {"none", "full_block", "full_uniform"}
    assert by_client["megatron_norm"] == {"none", "checkpoint_reentrant", "checkpoint_non_reentrant", "megatron"}
    assert "full_block" not in by_client["ops"] and "full_uniform" not in by_client["ops"]
    assert {case.pipeline for case in selection.cases if case.client != "ops"} == {"fused_residual_rmsnorm"}
    excluded = {reason.split(":")[0].split(" (")[0]: n for reason, n in selection.excluded.items()}
    # 11 other pipelines x 4 recomputes x 4 grad modes x 5 inputs x 2 params x 2 sequences x 2 dtypes
    assert excluded["megatron_norm builds its own TE pipeline"] == 11 * 4 * 4 * 5 * 2 * 2 * 2
    # leaf and detached under full_block and full_uniform, x 2 params x 2 dtypes
    assert selection.excluded[next(r for r in selection.excluded if r.startswith("full recompute"))] == 2 * 2 * 4
    assert selection.excluded[next(r for r in selection.excluded if r.startswith("under inference_mode"))] == 4
    # ops cases: 1600, as before the client axis had more values
    assert clients["ops"] == 1600


def test_rules_predict_the_reports_crash_through_megatron() -> None:
    assert ISSUE22.predict(block_case()).rule.name == "megatron_block_crashes_as_reported"
    assert ISSUE22.predict(block_case(recompute="full_uniform", input="leaf_requires_grad")).rule.name \
        == "megatron_block_crashes_as_reported"  # layer 1's input is layer 0's checkpoint output
    assert ISSUE22.predict(block_case(recompute="full_block", input="leaf_requires_grad")).rule.name \
        == "leaf_flag_cleared"
    assert ISSUE22.predict(block_case(recompute="none", grad_mode="no_grad")).rule.name \
        == "megatron_crashes_in_te_fused_norm"
    # TransformerBlock hands its layers a viewless copy of a view: under no_grad a leaf of its own.
    assert ISSUE22.predict(block_case(recompute="none", grad_mode="no_grad", input="view")).rule is None
    assert ISSUE22.predict(block_case(recompute="full_block", input="view")).rule is not None
    assert ISSUE22.predict(block_case(recompute="none")).rule is None


def _observation(traceback_text: str) -> dict:
    error = {"type": frames.REPORT_ERROR[0], "message": frames.REPORT_ERROR[1],
             "location": "transformer_engine/pytorch/ops/fuser.py:141"}
    observed = [{"file": f.file, "line": f.line, "function": f.function} for f in frames.frames_of(traceback_text)]
    return {"outcome": "crash", "error": error, "frames": observed, "side_effects": []}


def test_the_rule_needs_the_reports_frames_in_order() -> None:
    """The report's own traceback matches the rule; without a frame, or with two swapped, the
    same error is another failure (verdict other_failure on an unpatched target)."""
    prediction = ISSUE22.predict(block_case())
    # The report's text puts its traceback inside CheckpointFunction.forward; its excerpt starts below it.
    text = '  File "/x/megatron/core/tensor_parallel/random.py", line 607, in forward\n' + REPORT.read_text()
    assert verdict(prediction, _observation(text), Role.UNPATCHED)[0] == "reproduced"
    lines = text.splitlines()
    layer = next(i for i, line in enumerate(lines) if "_forward_attention" in line)
    without_layer = "\n".join(lines[:layer] + lines[layer + 1:])
    assert verdict(prediction, _observation(without_layer), Role.UNPATCHED)[0] == "other_failure"
    norm = next(i for i, line in enumerate(lines) if "extensions/transformer_engine.py" in line)
    swapped = lines[:]
    swapped[layer], swapped[norm] = lines[norm], lines[layer]
    assert verdict(prediction, _observation("\n".join(swapped)), Role.UNPATCHED)[0] == "other_failure"


def test_frame_table_shows_a_missing_frame() -> None:
    lines = REPORT.read_text().splitlines()
    without_layer = "\n".join(line for line in lines if "_forward_attention" not in line)
    record = {"case_id": REPORT_CASE, "target": "te-2.13.0", "client": "megatron_block", "recompute": "full_block",
              "input": "non_leaf", "verdict": "reproduced", "report_error": True,
              "frame_table": [row.as_dict() for row in frames.frame_table(without_layer)]}
    run = {"results": [record], "environment": {"targets": [{"spec": "te-2.13.0"}]}}
    text = "\n".join(render_md._frame_tables(run))
    assert "| `megatron/core/transformer/transformer_layer.py` | `_forward_attention` | 626 | **MISSING** |" in text
    assert ("(0 of 1 reproduced megatron_block cases under full recompute with the report's error have every frame"
            " in order)") in text


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("megatron-run")
    scratch = tmp_path_factory.mktemp("megatron-run-tmp")  # the run's processes' TMPDIR
    result = repro("run", "--matrix", "issue22", *(a for o in RUN_ONLY for a in ("--only", o)),
                   "--targets", ",".join(RUN_TARGETS), "--out", str(out), env={**os.environ, "TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stdout + result.stderr
    run = json.loads((out / "run.json").read_text())
    run["report_md"] = (out / "report.md").read_text()
    run["report_html"] = (out / "report.html").read_text()
    run["stderr"] = result.stderr
    run["left_in_tmp"] = sorted(p.name for p in scratch.iterdir())
    return run


def test_megatrons_workers_leave_nothing_in_the_temporary_directory(megatron_run: dict) -> None:
    assert megatron_run["left_in_tmp"] == []  # once a gloo file store's folder per worker


def test_run_reproduces_on_the_unpatched_release_at_fusers_requires_grad(megatron_run: dict) -> None:
    assert megatron_run["environment"]["megatron"]["version"] == "0.19.0"
    records = {(r["target"], r["case_id"]): r for r in megatron_run["results"]}
    assert len(records) == 5 * len(RUN_TARGETS)  # block: none, full_block, full_uniform; norm: none, megatron
    affected = [r for r in megatron_run["results"] if r["target"] == "te-2.13.0" and r["expected"] == "affected"]
    assert {r["client"] + " " + r["recompute"] for r in affected} == {
        "megatron_block full_block", "megatron_block full_uniform", "megatron_norm megatron"}
    for record in affected:
        assert record["verdict"] == "reproduced", record["verdict_reason"]
        assert record["error"]["type"] == "RuntimeError"
        assert frames.REPORT_ERROR[1] in record["error"]["message"]
        assert record["error"]["location"].startswith("transformer_engine/pytorch/ops/fuser.py:")
    report_case = records["te-2.13.0", REPORT_CASE]
    assert frames.matches_report([frames.FrameRow(**row) for row in report_case["frame_table"]])
    assert "## The bug report's frames in Megatron's traceback" in megatron_run["report_md"]
    assert f"case `{REPORT_CASE}` (2 of 2 reproduced" in megatron_run["report_md"]


def test_every_rendering_says_which_references_the_judge_cannot_vouch_for(megatron_run: dict) -> None:
    """The block's reference is the target's own (README, "References"): its records say so, and the
    terminal, report.html and issue22's verdict in report.md say how many; the norm's reference is the judge's."""
    from repro.render_md import plain

    from_target = [r for r in megatron_run["results"] if r.get("reference_from")]
    assert {r["client"] for r in from_target} == {"megatron_block"}
    assert len(from_target) == 3 * len(RUN_TARGETS)  # recompute none, full_block, full_uniform
    said = (f"{len(from_target)} results (megatron_block) on {len(RUN_TARGETS)} targets were judged against a"
            " reference the target's own worker computed: the judge cannot vouch for them")
    note = f"NOTE: {said}"
    assert f"\n- {plain(said)}\n" in megatron_run["report_md"]  # a bullet of issue22's verdict
    assert f"repro: {note}" in megatron_run["stderr"]
    assert note.replace("'", "&#39;") in megatron_run["report_html"]


@pytest.mark.parametrize("spec", ["te-2.13.0+backport", "te-2.16.0"])
def test_run_is_fixed_and_matches_the_block_without_recompute(megatron_run: dict, spec: str) -> None:
    mine = [r for r in megatron_run["results"] if r["target"] == spec]
    assert {r["verdict"] for r in mine if r["expected"] == "affected"} == {"fixed"}
    for record in mine:  # outputs, gradients (input and every parameter), caller's tensors: all checked, all equal
        assert record["outcome"] == "pass" and record["details"] == {}, record["details"]
    unaffected = [r for r in megatron_run["results"] if r["expected"] == "unaffected"]
    assert {r["verdict"] for r in unaffected} == {"unaffected"}


@pytest.mark.parametrize(("kernel", "outcome"), [("rmsnorm_fwd", "wrong_output"), ("rmsnorm_bwd", "wrong_grad")])
def test_a_broken_kernel_fails_the_block_against_its_reference(loaded_target, monkeypatch: pytest.MonkeyPatch,
                                                               kernel: str, outcome: str) -> None:
    """TE's RMSNorm op (in Megatron's input_layernorm) on a perturbed kernel: the block no longer
    matches the reference block, whose norm is torch's."""
    from harness.engine.execute import run_case

    rmsnorm = sys.modules["transformer_engine.pytorch.ops.basic.rmsnorm"]
    shipped = getattr(rmsnorm, kernel)

    def broken(*args, **kwargs):
        out = shipped(*args, **kwargs)
        return (out[0] * 1.05, *out[1:])

    case = block_case()
    assert run_case(case, loaded_target)["outcome"] == "pass"
    monkeypatch.setattr(rmsnorm, kernel, broken)
    if kernel == "rmsnorm_bwd":  # with the residual, TE's fused BackwardAddRMSNorm calls this one
        tex = sys.modules["transformer_engine_torch"]
        bwd_add = tex.rmsnorm_bwd_add
        monkeypatch.setattr(tex, "rmsnorm_bwd_add", lambda *args: (bwd_add(*args)[0] * 1.05, *bwd_add(*args)[1:]))
    observed = run_case(case, loaded_target)
    assert observed["outcome"] == outcome, observed["details"]


def test_bad_megatron_spec_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for spec in ("0.19", "path:" + str(tmp_path / "nowhere")):
        result = repro("run", "--matrix", "issue22", "--only", "client=megatron_norm", "--megatron", spec,
                       "--out", str(out))
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "valid:" in result.stderr, result.stderr
        assert not out.exists()
