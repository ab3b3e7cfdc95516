"""Issue 22 through Megatron's own code (megatron-core 0.19.0 from the package index).

Megatron runs in worker processes (one TE target and one Megatron per process); one worker
per target runs all of that target's scenarios, so Megatron is imported once per target.
The frame-table tests need no Megatron: they read traceback text, the report's own included.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from harness import targets
from harness.errors import UsageError
from harness.megatron import frames
from harness.megatron.source import DEFAULT_VERSION, PreparedMegatron, prepare_megatron
from harness.megatron.worker import run_in_subprocess
from tests.conftest import repro

REPORT = Path(__file__).resolve().parent / "fixtures" / "issue-22-traceback.txt"
SCENARIOS = [("megatron_block", "full_block"), ("megatron_block", "full_uniform"), ("megatron_block", "none"),
             ("megatron_norm", "megatron_checkpoint"), ("megatron_norm", "none")]
TE_FUSED_NORM = ["transformer_engine.pytorch.ops.basic.make_extra_output.MakeExtraOutput",
                 "transformer_engine.pytorch.ops.basic.rmsnorm.RMSNorm"]
AFFECTED = {"megatron_block full_block", "megatron_block full_uniform", "megatron_norm megatron_checkpoint"}


@pytest.fixture(scope="module")
def megatron(cache: Path) -> PreparedMegatron:
    return prepare_megatron(DEFAULT_VERSION, cache)


@pytest.fixture(scope="module")
def run_target(cache: Path, megatron: PreparedMegatron):
    """spec -> the worker's report for all SCENARIOS on that target (one worker per target)."""
    reports: dict[str, dict] = {}

    def run(spec: str) -> dict:
        if spec not in reports:
            reports[spec] = run_in_subprocess(targets.prepare(spec, cache), megatron, SCENARIOS)
            assert reports[spec]["load_error"] is None, reports[spec]["load_error"]
        return reports[spec]

    return run


def _results(report: dict) -> dict[str, dict]:
    return {f"{r['client']} {r['recompute']}": r for r in report["results"]}


def check_crashes_only_under_recompute(report: dict) -> None:
    for key, result in _results(report).items():
        if key not in AFFECTED:
            assert result["completed"] and result["matched"], (key, result.get("error"), result.get("failures"))
            continue
        assert not result["completed"], key
        error = result["error"]
        assert (error["type"], frames.REPORT_ERROR[1] in error["message"]) == (frames.REPORT_ERROR[0], True), error
        assert error["location"].startswith("transformer_engine/pytorch/ops/fuser.py:"), error["location"]


def check_completes_and_matches(report: dict) -> None:
    for key, result in _results(report).items():
        assert result["completed"], (key, result.get("error"))
        assert result["matched"], (key, result["failures"])
        assert result["compared"]["parameter_grads"] >= 1
        # The structure meant to run is the one that ran: TE's own ops in Megatron's fused norm.
        assert result["structure"] and all(ops == TE_FUSED_NORM for ops in result["structure"]), result["structure"]


@pytest.mark.parametrize("spec", ["te-2.8.0", "te-2.9.0"])
def test_block_builds_on_releases_that_name_cuda_streams_and_synchronize(run_target, spec: str) -> None:
    """2.5-2.9's CPU-offload handler makes two torch.cuda.Stream()s even with offloading off,
    and Megatron's TransformerBlock builds it; 2.5-2.8's get_extra_state (every state_dict of a
    TE op) calls torch.cuda.synchronize(). From TE's files both are the CPU's."""
    check_crashes_only_under_recompute(run_target(spec))


def test_unpatched_release_crashes_only_under_recompute(run_target) -> None:
    check_crashes_only_under_recompute(run_target("te-2.13.0"))


@pytest.mark.parametrize("recompute", ["full_block", "full_uniform"])
def test_block_crash_has_the_reports_frames_in_order(run_target, recompute: str) -> None:
    result = _results(run_target("te-2.13.0"))[f"megatron_block {recompute}"]
    rows = result["frame_table"]
    assert [(r["expected_file"], r["expected_function"]) for r in rows] == [f[:2] for f in frames.REPORT_FRAMES]
    assert all(r["observed"] and r["in_order"] for r in rows), rows
    observed = {r["expected_file"]: r["observed"] for r in rows}
    # megatron-core 0.19.0 has the report's Megatron lines exactly.
    assert observed["megatron/core/transformer/transformer_layer.py"].endswith(":626")
    assert observed["megatron/core/extensions/transformer_engine.py"].endswith(":790")
    assert result["matches_report"]
    assert result["frames"][-1]["file"] == "transformer_engine/pytorch/ops/fuser.py"


@pytest.mark.parametrize("spec", ["te-2.13.0+backport", "te-2.16.0"])
def test_fixed_targets_complete_and_match_the_block_without_recompute(run_target, spec: str) -> None:
    check_completes_and_matches(run_target(spec))


@pytest.mark.parametrize("spec", ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0"])
def test_target_and_megatron_descriptions_say_what_is_real(run_target, spec: str) -> None:
    report = run_target(spec)
    assert "TE as shipped; kernels: the harness's CPU stand-ins (" in report["target_description"]
    assert "TE's own: MakeExtraOutput" in report["target_description"]
    assert "RMSNorm" in report["target_description"].split("TE's own:")[1]
    megatron = report["megatron_description"]
    assert "TEFusedResidualRMSNorm defined" in megatron
    assert "TE as shipped under Megatron:" in megatron


def test_checks_fail_on_the_wrong_target(run_target) -> None:
    """The two checks above, crossed: each fails on the other kind of target."""
    with pytest.raises(AssertionError):
        check_crashes_only_under_recompute(run_target("te-2.16.0"))
    with pytest.raises(AssertionError):
        check_completes_and_matches(run_target("te-2.13.0"))


# -- frame table, on traceback text ------------------------------------------------------

def test_report_traceback_has_every_frame_but_the_checkpoint_one() -> None:
    rows = frames.frame_table(REPORT.read_text())
    assert [r.observed for r in rows] == [
        None, "megatron/core/transformer/transformer_layer.py:626",
        "megatron/core/extensions/transformer_engine.py:790", "transformer_engine/pytorch/ops/sequential.py:189",
        "transformer_engine/pytorch/ops/fuser.py:510", "transformer_engine/pytorch/ops/fuser.py:134",
    ]
    assert all(r.in_order for r in rows[1:]) and not frames.matches_report(rows)


def test_missing_and_out_of_order_frames_are_shown() -> None:
    text = REPORT.read_text()
    blocks = text.split("[rank0]:   File ")
    header, frame_blocks = blocks[0], blocks[1:]
    without_sequential = [b for b in frame_blocks if "ops/sequential.py" not in b]
    rows = frames.frame_table(header + "".join("[rank0]:   File " + b for b in without_sequential))
    assert rows[3].observed is None and not rows[3].in_order
    # Megatron's extension frame moved below the fuser's: the TE frames now come before it,
    # so they are reported out of order, and still located.
    ext = next(b for b in frame_blocks if "extensions/transformer_engine.py" in b)
    reordered = [b for b in frame_blocks if b is not ext] + [ext]
    rows = frames.frame_table(header + "".join("[rank0]:   File " + b for b in reordered))
    assert [(r.in_order, r.observed is not None) for r in rows[1:]] == [
        (True, True), (True, True), (False, True), (False, True), (False, True)]
    assert not frames.matches_report(rows)


# -- the source: never written to, bad input, unsafe wheels --------------------------------

def test_sources_are_never_written_to(tmp_path: Path, cache: Path, megatron: PreparedMegatron) -> None:
    te_copy, megatron_copy = tmp_path / "te", tmp_path / "megatron"
    te_root = Path(targets.prepare("te-2.16.0", cache).root or "")
    shutil.copytree(te_root / "transformer_engine", te_copy / "transformer_engine")
    for info in te_root.glob("transformer_engine-*.dist-info"):  # its version, which Megatron reads
        shutil.copytree(info, te_copy / info.name)
    shutil.copytree(Path(megatron.root) / "megatron", megatron_copy / "megatron")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # or it proves nothing
    report = run_in_subprocess(targets.prepare(f"path:{te_copy}", cache),
                               prepare_megatron(f"path:{megatron_copy}", cache), [("megatron_norm", "none")], env=env)
    assert report["load_error"] is None and report["results"][0]["completed"], report
    after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert after == before, sorted(str(p) for p in set(after) ^ set(before))[:5]


def test_prepared_megatron_is_json(megatron: PreparedMegatron) -> None:
    assert PreparedMegatron.from_json(megatron.to_json()) == megatron
    assert megatron.version == DEFAULT_VERSION and megatron.source.startswith("megatron_core-0.19.0-")
    assert (Path(megatron.root) / "megatron/core/transformer/transformer_layer.py").is_file()


@pytest.mark.parametrize("spec", ["latest", "path:/nonexistent/megatron", "0.19"])
def test_bad_megatron_spec_is_a_usage_error(spec: str, cache: Path) -> None:
    with pytest.raises(UsageError, match="valid"):
        prepare_megatron(spec, cache, offline=True)


def test_zip_slip_megatron_wheel_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "megatron_core-0.0.1-cp312-cp312-manylinux_2_28_x86_64.whl", "w") as archive:
        archive.writestr("megatron_core-0.0.1.dist-info/RECORD", "")  # a whole wheel, but for the member below
        archive.writestr("../../escaped.py", "x = 1\n")
    with pytest.raises(UsageError, match="points outside"):
        prepare_megatron("0.0.1", tmp_path, offline=True)
    assert not (tmp_path.parent / "escaped.py").exists() and not list((tmp_path / "src").glob("*/**/*.py"))


def _private_megatron_cache(tmp_path: Path, megatron: PreparedMegatron) -> Path:
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    shutil.copy2(Path(megatron.root).parent.parent / "wheels" / megatron.source, private / "wheels")
    return private


def test_damaged_unpacked_megatron_is_unpacked_again(tmp_path: Path, megatron: PreparedMegatron) -> None:
    private = _private_megatron_cache(tmp_path, megatron)
    root = Path(prepare_megatron(DEFAULT_VERSION, private, offline=True).root)
    layer = root / "megatron/core/transformer/transformer_layer.py"
    good = layer.read_bytes()
    layer.write_bytes(good.replace(b"def _forward_attention", b"def _edited_in_the_cache"))
    (root / "megatron/core/tensor_parallel/random.py").unlink()
    again = Path(prepare_megatron(DEFAULT_VERSION, private, offline=True).root)
    assert (again / "megatron/core/transformer/transformer_layer.py").read_bytes() == good
    assert (again / "megatron/core/tensor_parallel/random.py").is_file()


def test_truncated_megatron_wheel_is_refused_with_what_to_delete(tmp_path: Path, megatron: PreparedMegatron) -> None:
    private = _private_megatron_cache(tmp_path, megatron)
    wheel = next((private / "wheels").glob("megatron_core-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:100_000])
    with pytest.raises(UsageError, match="damaged.*delete it"):
        prepare_megatron(DEFAULT_VERSION, private, offline=True)
    assert not (private / "src").exists() or not any((private / "src").iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["--client", "gpt"], "unknown client 'gpt'; valid: megatron_norm, megatron_block"),
    (["--client", "megatron_norm", "--recompute", "full_block"], "is not one of megatron_norm's"),
    (["--megatron", "0.19.0"], "--megatron and --recompute go with --client"),
    (["--client", "megatron_block", "--megatron", "path:/nonexistent"], "is not a Megatron checkout"),
])
def test_bad_client_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = repro("minimal", "--target", "te-2.16.0", *args, check_rc=2)
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_megatron_version_not_on_index_leaves_no_partial_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = repro("minimal", "--target", "te-2.16.0", "--client", "megatron_norm", "--megatron", "9.9.9",
                   "--cache-dir", str(cache), check_rc=2)
    assert "megatron-core==9.9.9" in result.stderr
    assert [p for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock" and "te-2.16.0" not in str(p)
            and "transformer_engine" not in p.name] == []


def test_minimal_client_prints_frames_down_to_fuser() -> None:
    out = repro("minimal", "--target", "te-2.13.0", "--client", "megatron_block", check_rc=0).stdout
    lines = out.splitlines()
    for needle in ("megatron/core/transformer/transformer_layer.py:626 in _forward_attention",
                   "megatron/core/extensions/transformer_engine.py:790 in forward",
                   "transformer_engine/pytorch/ops/sequential.py:187 in forward",
                   "transformer_engine/pytorch/ops/fuser.py:141 in forward"):
        assert any(needle in line for line in lines), needle
    assert "RuntimeError: you can only change requires_grad flags of leaf variables" in out
    assert "matches the report (frames, order, error): yes" in out


def test_megatrons_te_names_are_tes_own(loaded_target) -> None:
    """The shared test process loaded Megatron on the whole TE package: the classes and state
    Megatron imports from TE at module level are TE's own, from the target's files."""
    from harness.megatron.loader import loaded

    extension = loaded().module("extensions.transformer_engine")
    te_dir = str(loaded_target.te_dir)
    for name in ("Linear", "LayerNormLinear", "RMSNorm", "DotProductAttention"):
        cls = getattr(extension.te.pytorch, name)
        assert sys.modules[cls.__module__].__file__.startswith(te_dir), (name, cls.__module__)
    tracker = sys.modules["transformer_engine.pytorch.distributed"].CudaRNGStatesTracker
    assert sys.modules[tracker.__module__].__file__.startswith(te_dir)
    assert issubclass(extension.TEFusedResidualRMSNorm, extension.te.pytorch.RMSNorm)


@pytest.mark.parametrize("broken", [None, "forward_eps", "backward_dgamma"])
def test_norm_comparison_catches_a_broken_kernel(loaded_target, monkeypatch: pytest.MonkeyPatch, broken) -> None:
    """megatron_norm's reference is plain torch, so a broken kernel under TE's own op shows."""
    from harness.megatron.loader import loaded
    from harness.megatron.minimal import run_client_minimal

    op_module = sys.modules["transformer_engine.pytorch.ops.basic.rmsnorm"]
    fwd, bwd = op_module.rmsnorm_fwd, op_module.rmsnorm_bwd
    if broken == "forward_eps":
        monkeypatch.setattr(op_module, "rmsnorm_fwd", lambda x, w, eps, *rest: fwd(x, w, 0.5, *rest))
    elif broken == "backward_dgamma":
        monkeypatch.setattr(op_module, "rmsnorm_bwd", lambda *args: (bwd(*args)[0], bwd(*args)[1] * 1.1))
        # With the residual, TE's fusion pass runs BackwardAddRMSNorm, which calls this kernel instead.
        tex = sys.modules["transformer_engine_torch"]
        bwd_add = tex.rmsnorm_bwd_add
        monkeypatch.setattr(tex, "rmsnorm_bwd_add", lambda *args: (bwd_add(*args)[0], bwd_add(*args)[1] * 1.1))
    result = run_client_minimal(loaded_target, loaded(), "megatron_norm", "megatron_checkpoint")
    assert result["completed"], result["error"]
    assert result["matched"] is (broken is None), result["failures"]
    if broken == "forward_eps":
        assert any(f.startswith("output 0") for f in result["failures"])
    if broken == "backward_dgamma":
        assert [f.split(":")[0] for f in result["failures"]] == ["grad of weight"]


def test_release_before_213_runs_megatrons_norm_on_tes_own_module() -> None:
    """te-2.5.0's te.pytorch.RMSNorm is TE's own now (the whole package as shipped): Megatron's
    TEFusedResidualRMSNorm builds on it and matches plain torch."""
    result = repro("minimal", "--target", "te-2.5.0", "--client", "megatron_norm")
    assert "completed: forward and backward" in result.stdout and "matched the reference" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
