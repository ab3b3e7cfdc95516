"""The generated matrix: pipelines made from the op database and TE's fusion windows, judged
against plain PyTorch and against unfused TE; `repro coverage` and `repro shrink`. The end-to-end
test breaks a fused op and an op's backward in a git tree built from te-2.13.0 and checks that a
review on the generated matrix finds both and the shrinker reduces a failure to its window."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import cases.regressions  # noqa: F401 - declares the catalogue's axes, which Cases read
from cases.case import Case
from cases.matrix import generate, selections_of
from cases.ops import references as ref
from cases.ops.database import FUSIONS, OPS
from cases.ops.generated import GENERATED, SEED, _longer, generated_keys, keys_of, name_of, pipeline_of, valid
from harness.runner.coverage import coverage
from harness.runner.shrink import candidates, shrink
from harness.runner.signature import Signature
from harness.targets import sources
from repro import reports
from tests.conftest import repro
from tests.forks import git


def test_every_op_alone_every_window_and_a_stable_seeded_sample() -> None:
    keys = [keys_of(name) for name in GENERATED]
    assert all(k is not None and valid(k) and name_of(k) in GENERATED for k in keys)
    assert {(k,) for k in OPS} <= set(keys)
    windows = {w for f in FUSIONS for w in f.windows}
    assert windows and windows <= set(keys)
    assert all(len(k) <= 3 or k in _longer(SEED, 24) for k in keys if k is not None)  # longer ones: the sample
    assert generated_keys() == generated_keys() and _longer(SEED, 24) != _longer(SEED + 1, 24)
    assert not valid(("swiglu",) * 5)  # 16 -> 8 -> 4 -> 2 -> 1: the fifth cannot split an odd width
    assert not valid(("add_in", "add_in_ip"))  # the call makes one extra input


def test_a_generated_pipelines_reference_is_its_ops_references_in_order() -> None:
    pipeline = pipeline_of(("linear", "bias", "add_in_ip", "extra_out", "swiglu"))
    assert [name for name, _ in pipeline.params] == ["0.weight", "1.bias"]
    assert pipeline.extra_input_shapes == ((4, 16),) and pipeline.makes_extra_output
    x, residual = torch.randn(4, 16), torch.randn(4, 16)
    weight, bias = torch.randn(16, 16), torch.randn(16)
    main, extra = pipeline.reference(x, [residual.clone()], [weight, bias])
    total = x @ weight.t() + bias + residual
    torch.testing.assert_close(extra, total)
    torch.testing.assert_close(main, ref.gated("silu", total))


def test_all_stays_the_catalogue_and_joins_the_generated_matrix_by_name() -> None:
    assert "generated" not in {s.regression.id for s in generate("all")}
    assert [s.regression.id for s in generate("issue22,generated")] == ["issue22", "generated"]
    # Any valid sequence of op keys names a case, also one the matrix does not hold (what the shrinker tries).
    short = "generated:ops-gen.extra_out_ip.reglu-enabled-non_leaf-trainable-none-single-dense-float32-cpu"
    assert "gen.extra_out_ip.reglu" not in GENERATED and selections_of([short])[0].cases[0].case_id == short
    assert repro("run", "--matrix", "all,nope", check_rc=2).stderr.count("\n") == 1


def _case(pipeline: str, **axes: str) -> Case:
    values = {"client": "ops", "pipeline": pipeline, "grad_mode": "enabled", "input": "non_leaf",
              "params": "trainable", "recompute": "none", "sequence": "single", "grad_form": "expanded",
              "dtype": "bfloat16", "device": "cpu", **axes}
    return Case("generated", **values)


def test_shrink_keeps_what_still_fails_the_same_way() -> None:
    """A pretend target that fails every pipeline holding [MakeExtraOutput, RMSNorm] under an expanded
    gradient: the shrinker drops the other ops and simplifies every axis the failure does not need."""
    wanted: Signature = ("wrong_grad", "", "", "gradients")

    def run(proposed: list[Case]) -> dict[str, Signature | None]:
        def fails(case: Case) -> bool:
            keys = keys_of(case.pipeline) or ()
            held = any(keys[i:i + 2] == ("extra_out", "rmsnorm") for i in range(len(keys)))
            return held and case.grad_form == "expanded"
        return {c.case_id: wanted if fails(c) else ("pass", "", "") for c in proposed}

    start = _case("gen.linear.extra_out.rmsnorm.gelu")
    assert all(c.case_id != start.case_id for c in candidates(start))
    shrunk = shrink(start, wanted, run)
    assert shrunk.minimal == _case("gen.extra_out.rmsnorm", input="leaf", dtype="float32")
    assert shrunk.steps[0].startswith("pipeline:") and len(shrunk.steps) == 4


def test_coverage_says_what_each_op_reached_and_why_not() -> None:
    inventory = {"basic": ["BasicLinear", "Quantize", "FancyOp", "SiLU"],
                 "fused": ["BackwardAddRMSNorm", "ForwardLinearBiasActivation", "UserbuffersForwardLinear", "Mystery"]}
    records: list[Mapping[str, Any]] = [
        {"pipeline": "gen.linear.bias", "outcome": "pass", "fused_ops": ["forward:ForwardLinearBiasActivation"]},
        {"pipeline": "gen.extra_out.rmsnorm", "outcome": "pass", "fused_ops": []},
        {"pipeline": "gen.silu", "outcome": "not_applicable", "note": "lacks SiLU", "fused_ops": []},
    ]
    rows = {r.name: r for r in coverage(inventory, records)}
    assert rows["BasicLinear"].reached and rows["BasicLinear"].how == "1 cases"
    assert "FP8" in rows["Quantize"].how
    assert rows["FancyOp"].how.startswith("no op database entry")
    assert not rows["SiLU"].reached and "lacks SiLU" in rows["SiLU"].how
    assert rows["ForwardLinearBiasActivation"].reached
    assert "the pass never fired" in rows["BackwardAddRMSNorm"].how and "not in place" in rows["BackwardAddRMSNorm"].how
    assert "Userbuffers" in rows["UserbuffersForwardLinear"].how
    assert rows["Mystery"].how.startswith("no fusion window")


def _broken_tree(root: Path) -> tuple[Path, str, str]:
    """A git tree of te-2.13.0; its head commit breaks BackwardAddRMSNorm (the extra output's
    gradient dropped) and GELU's backward (ReLU's instead)."""
    from harness import targets

    release = Path(targets.prepare("te-2.13.0", sources.cache_dir()).root)
    repo = root / "te"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shutil.copytree(release / "transformer_engine", repo / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "build_tools").mkdir()
    (repo / "build_tools/VERSION.txt").write_text("2.13.0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "te-2.13.0")
    base = git(repo, "rev-parse", "HEAD")
    edits = {"transformer_engine/pytorch/ops/fused/backward_add_rmsnorm.py":
             ("add = maybe_dequantize(extra_grad.contiguous(), dtype).view(x.size())", "add = torch.zeros_like(dy)"),
             "transformer_engine/pytorch/ops/basic/activation.py":
             ("return tex.dgelu(*args, **kwargs)", "return tex.drelu(*args, **kwargs)")}
    for relative, (old, new) in edits.items():
        path = repo / relative
        text = path.read_text()
        assert text.count(old) == 1, relative
        path.write_text(text.replace(old, new))
    git(repo, "commit", "-q", "-am", "break a fused op and an op's backward")
    return repo, base, git(repo, "rev-parse", "HEAD")


@pytest.mark.slow
def test_a_broken_fusion_and_backward_are_found_by_the_review_and_shrunk(tmp_path: Path) -> None:
    repo, base, head = _broken_tree(tmp_path)
    out = tmp_path / "review"
    pipelines = "gen.extra_out.rmsnorm,gen.linear.extra_out.rmsnorm,gen.gelu,gen.rmsnorm"
    result = repro("review", "--base", f"path:{repo}@{base}", "--head", f"path:{repo}@{head}", "--matrix",
                   "generated", "--only", f"pipeline={pipelines}", "--only", "grad_mode=enabled", "--only",
                   "input=non_leaf", "--only", "dtype=float32", "--only", "grad_form=dense", "--out", str(out), "-n", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    found = json.loads((out / "review.json").read_text())
    text = json.dumps(found)
    for pipeline in ("gen.extra_out.rmsnorm", "gen.linear.extra_out.rmsnorm", "gen.gelu"):
        assert pipeline in text
    assert "gen.rmsnorm-" not in text  # unchanged: not listed as a change
    records = {r["pipeline"]: r for r in reports.load_run(out)["results"] if r["target"].endswith(head)}
    fused = records["gen.extra_out.rmsnorm"]
    # The broken fused op differs from TE's own unfused ops too: no hand-written reference needed.
    assert fused["unfused_te"] == "differs" and fused["outcome"] == "wrong_grad"
    assert any(d.startswith("fused vs unfused TE: grad of base") for d in fused["details"]["gradients"])
    assert records["gen.gelu"]["unfused_te"] == "agrees" and records["gen.gelu"]["outcome"] == "wrong_grad"
    assert records["gen.rmsnorm"]["outcome"] == "pass"

    start = records["gen.linear.extra_out.rmsnorm"]["case_id"]
    shrunk = repro("shrink", start, "--target", f"path:{repo}@{head}", "--out", str(tmp_path / "shrink"), check_rc=0)
    minimal = shrunk.stdout.split("minimal: ")[1].split()[0]
    assert Case.from_id(minimal).pipeline == "gen.extra_out.rmsnorm", shrunk.stdout
    assert (tmp_path / "shrink" / "minimal.py").read_text().count("te.ops.") >= 2

    listed = repro("coverage", str(out), "--target", f"path:{repo}@{head}", check_rc=0).stdout
    assert "BackwardAddRMSNorm           reached" in listed and "UserbuffersForwardLinear" in listed


def test_a_kernel_the_backend_lacks_is_a_harness_error_never_a_regression() -> None:
    from harness.engine.compare import compared

    case = _case("gen.gelu")
    missing = {"type": "MissingKernel", "message": "target te-x: ops/basic/activation.py:9 in f called the compiled "
               "kernel transformer_engine_torch.gelu, which has no CPU stand-in", "location": None}
    side = {"outputs": [], "requires_grad": [], "before": {}, "after": {}, "grads": {}}
    record = compared(case, {"test": side, "error": missing}, side, "2.13.0")
    assert record["outcome"] == "harness_error" and "cannot run this case" in record["note"]
    crashed = compared(case, {"test": side, "error": {**missing, "type": "RuntimeError"}}, side, "2.13.0")
    assert crashed["outcome"] == "crash"


def test_refused_device_calls_show_where_te_needs_cuda(tmp_path: Path) -> None:
    """The same cases answered (they pass) and refused (each crashes naming TE's CUDA call and line)."""
    selection = ["--matrix", "generated", "--targets", "te-2.13.0", "--only", "pipeline=gen.linear.bias", "--only",
                 "dtype=float32", "--only", "grad_mode=enabled", "--only", "grad_form=dense", "-n", "1"]
    repro("run", *selection, "--out", str(tmp_path / "answered"), check_rc=0)
    repro("run", *selection, "--refuse-device-calls", "--out", str(tmp_path / "refused"), check_rc=1)
    answered, refused = (reports.load_run(tmp_path / name) for name in ("answered", "refused"))
    assert "device_calls_refused" not in answered["environment"] and refused["environment"]["device_calls_refused"]
    assert {r["outcome"] for r in answered["results"]} == {"pass"}
    assert any("torch.cuda." in call for r in answered["results"] for call in r["device_calls"])
    errors = [r["error"] for r in refused["results"]]
    assert errors and all(e["type"] == "DeviceCallRefused" for e in errors)
    assert all(" at transformer_engine/pytorch/" in e["message"] for e in errors)
    assert "CUDA calls were refused" in (tmp_path / "refused" / "report.md").read_text()
    assert "refused them (<code>--refuse-device-calls</code>)" in (tmp_path / "refused" / "report.html").read_text()


def test_communication_ops_run_at_world_size_one(tmp_path: Path) -> None:
    """AllReduce at world size 1 hands its input back, as Identity does: under no_grad, on a non-leaf
    input, te-2.13.0's fuser fails on it as issue 22 says, and te-2.16.0 behaves as plain PyTorch.
    The standalone reproducer starts the one-process group itself."""
    case_id = "generated:ops-gen.all_reduce-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
    script = tmp_path / "case.py"
    script.write_text(repro("show", case_id, "--target", "te-2.13.0", "--script", "--standalone", check_rc=0).stdout)
    assert 'init_process_group("gloo"' in script.read_text()
    failed = repro("exec", "--target", "te-2.13.0", "--", sys.executable, str(script))
    assert failed.returncode == 1 and "you can only change requires_grad flags" in failed.stderr
    assert "OK" in repro("exec", "--target", "te-2.16.0", "--", sys.executable, str(script), check_rc=0).stdout


def test_a_matrix_that_predicts_no_failure_headlines_what_behaved_not_roles() -> None:
    from cases.regressions import REGRESSIONS
    from harness.runner.headlines import regression_headline

    def record(case_id: str, outcome: str) -> dict[str, Any]:
        return {"case_id": case_id, "target": "te-2.13.0", "regression": "generated", "outcome": outcome,
                "expected": "unaffected",
                "verdict": {"pass": "unaffected", "not_applicable": "not_applicable"}.get(outcome, "regression")}

    run = {"results": [record("a", "pass"), record("b", "crash"), record("c", "not_applicable")],
           "environment": {"targets": [{"spec": "te-2.13.0", "roles": {"generated": "fixed_upstream"}}]}}
    lines = regression_headline(run, "generated")
    assert lines[0] == "te-2.13.0: 1 of 2 cases that ran behave as their references (none is predicted to fail)"
    assert not any("affected cases" in line for line in lines) and lines[-1] == "ATTENTION: 1 regression"
    assert REGRESSIONS["generated"].first_fixed is None and REGRESSIONS["issue22"].first_fixed == "2.16.0"


def test_a_fused_call_that_raises_where_unfused_te_completes_differs_from_it() -> None:
    """TE-FL's reference backend lacks rmsnorm_bwd_add: the fused [MakeExtraOutput, RMSNorm] raises in
    backward, the same ops unfused complete. The second oracle says so, never 'agrees'."""
    from harness.engine.compare import compared

    case = _case("gen.extra_out.rmsnorm")
    side = {"outputs": [], "requires_grad": [], "before": {}, "after": {}, "grads": {}}
    error = {"type": "RuntimeError", "message": "op='rmsnorm_bwd_add' not implemented", "location": None}
    record = compared(case, {"test": side, "error": error, "unfused": side}, side, "2.9.0")
    assert record["outcome"] == "crash" and record["unfused_te"] == "differs"
    both = compared(case, {"test": side, "error": error, "unfused": {"error": error}}, side, "2.9.0")
    assert both["unfused_te"] == "failed: RuntimeError"
