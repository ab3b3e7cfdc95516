"""`repro show --script --standalone` and `repro exec`: a reproducer that needs only torch and
TE, run against a target's TE through the CPU backend. The same script crashes on te-2.13.0
(issue 22) and passes on te-2.16.0 (the upstream fix)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import targets
from harness.targets import sources
from tests.conftest import REPO, repro

CRASH_CASE = "issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
SPLIT_CASE = "issue22:ops-split_fuser-enabled-view-frozen-checkpoint_reentrant-single-dense-float32-cpu"


def exec_in(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", "exec", *args], capture_output=True, text=True,
                          check=False, cwd=REPO, env=env, timeout=300)


def standalone(tmp_path: Path, case_id: str, target: str = "te-2.13.0") -> Path:
    text = repro("show", case_id, "--target", target, "--script", "--standalone", check_rc=0).stdout
    path = tmp_path / "case.py"
    path.write_text(text)
    return path


def test_standalone_script_imports_only_torch_and_te(tmp_path: Path) -> None:
    text = standalone(tmp_path, CRASH_CASE).read_text()
    imports = re.findall(r"^(?:import|from) (\S+)", text, re.MULTILINE)
    assert imports == ["torch", "transformer_engine.pytorch"]
    assert "import transformer_engine.pytorch as te" in text and "te.ops.Sequential(" in text
    assert "te.ops.MakeExtraOutput()," in text and "te.ops.RMSNorm(16, device=DEVICE, dtype=DTYPE)," in text
    assert "with torch.no_grad():" in text and "x = base * 2" in text
    compile(text, "case.py", "exec")


@pytest.mark.parametrize("target, passes", [("te-2.13.0", False), ("te-2.16.0", True)])
def test_standalone_script_through_exec(target: str, passes: bool, tmp_path: Path) -> None:
    script = standalone(tmp_path, CRASH_CASE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # so a write would show
    result = exec_in(tmp_path, "--target", target, "--", sys.executable, str(script), env=env)
    if passes:
        assert result.returncode == 0, result.stderr
        assert "OK: behaves as unfused PyTorch" in result.stdout
    else:
        assert result.returncode == 1
        assert "transformer_engine/pytorch/ops/fuser.py" in result.stderr
        assert "RuntimeError: you can only change requires_grad flags of leaf variables" in result.stderr
    te_dir = Path(targets.prepare(target, sources.cache_dir()).root or "") / "transformer_engine"
    assert not list(te_dir.rglob("__pycache__")), "exec wrote bytecode into the target"


def test_standalone_split_fuser_under_checkpoint(tmp_path: Path) -> None:
    script = standalone(tmp_path, SPLIT_CASE)
    text = script.read_text()
    assert "class Tanh(torch.nn.Module):" in text and "use_reentrant=True" in text
    result = exec_in(tmp_path, "--target", "te-2.16.0", "--", sys.executable, str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    crashed = exec_in(tmp_path, "--target", "te-2.13.0", "--", sys.executable, str(script))
    assert crashed.returncode == 1 and "only change requires_grad flags of leaf variables" in crashed.stderr


def test_exec_gives_te_ops_from_the_loaded_target(tmp_path: Path) -> None:
    code = ("import transformer_engine.pytorch as te; "
            "print(te.ops.MakeExtraOutput.__module__, te.ops.RMSNorm.__module__, te.ops.BasicLinear.__module__,"
            " te.ops.Sequential.__module__)")
    result = exec_in(tmp_path, "--target", "te-2.16.0", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    # TE's own classes, every one (the whole package as shipped; only the extension's kernels stood in).
    assert result.stdout.split() == ["transformer_engine.pytorch.ops.basic.make_extra_output",
                                     "transformer_engine.pytorch.ops.basic.rmsnorm",
                                     "transformer_engine.pytorch.ops.basic.basic_linear",
                                     "transformer_engine.pytorch.ops.sequential"]


@pytest.mark.parametrize("args, message", [
    (["--target", "te-nonsense", "--", "python", "-c", "pass"], "unknown target spec 'te-nonsense'"),
    (["--target", "te-2.16.0"], "exec needs a command after --"),
    (["--target", "te-2.16.0", "--", "no-such-command-here"], "command not found: no-such-command-here"),
])
def test_exec_bad_input_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = exec_in(tmp_path, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_show_standalone_needs_script() -> None:
    result = repro("show", CRASH_CASE, "--standalone", check_rc=2)
    assert "--standalone goes with --script" in result.stderr


def test_standalone_megatron_recompute_through_exec(tmp_path: Path) -> None:
    """Megatron's own CheckpointFunction around te.ops: crashes on te-2.13.0, passes on te-2.16.0."""
    script = standalone(tmp_path, "issue22:ops-fused_residual_rmsnorm-enabled-non_leaf-trainable-megatron-single-dense-float32-cpu")
    assert "megatron_random.checkpoint(model, False, *args)" in script.read_text()
    crashed = exec_in(tmp_path, "--target", "te-2.13.0", "--megatron", "--", sys.executable, str(script))
    assert crashed.returncode == 1 and "only change requires_grad flags of leaf variables" in crashed.stderr
    passed = exec_in(tmp_path, "--target", "te-2.16.0", "--megatron", "--", sys.executable, str(script))
    assert passed.returncode == 0, passed.stderr


def _lines_printed(tmp_path: Path, target: str, lines_of_code: list[str]) -> list[str]:
    """What a script run under `repro exec --target TARGET` prints, line by line; it must exit 0."""
    result = exec_in(tmp_path, "--target", target, "--", sys.executable, "-c", "\n".join(lines_of_code))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_device_answers_serve_only_the_targets_files(tmp_path: Path) -> None:
    """TE asks torch.cuda about the device and gets the CPU backend's answer (8.0, no FP8); the
    user's own code, and torch.compile's inductor, get torch's own (a host without CUDA). And
    CUDA's autocast state, read from TE's files, is the CPU's."""
    printed = _lines_printed(tmp_path, "te-2.13.0", [
        "import torch, transformer_engine.pytorch as te",
        "from transformer_engine.pytorch.utils import get_device_compute_capability",
        "print('te', get_device_compute_capability())",
        "try:\n    torch.cuda.get_device_properties(0); print('user answered')",
        "except (AssertionError, RuntimeError):\n    print('user refused')",
        "print('user autocast', torch.is_autocast_enabled())",
        "with torch.autocast('cpu', dtype=torch.bfloat16):",
        "    y = te.ops.Linear(16, 16, bias=False, device='cpu')(torch.ones(4, 16))",
        "print('te autocast', y.dtype)"])
    assert printed == ["te (8, 0)", "user refused", "user autocast False", "te autocast torch.bfloat16"], printed


def test_tes_triton_kernels_are_stood_in_at_the_boundary(tmp_path: Path) -> None:
    """TE's `@triton.jit` kernels run nowhere on a host without a GPU: its kernel modules run as
    shipped, then a kernel with a stand-in runs ours, and one without raises MissingKernel with
    TE's caller, when launched (never at import)."""
    lines = _lines_printed(tmp_path, "te-2.16.0", [
        "import torch, transformer_engine.pytorch as te",
        "from transformer_engine.pytorch.triton.grouped_dbias_dscales import compute_grouped_dbias",
        "dy = torch.arange(12.).reshape(4, 3)",
        "print(compute_grouped_dbias(dy, torch.tensor([0, 1, 4]), 2).tolist())",
        "from transformer_engine.pytorch.triton import pad",
        "try:\n    pad.pad_columnwise_scale_inv(torch.ones(3, 5))",
        "except Exception as exc:\n    print(type(exc).__name__, exc)"])
    assert lines[0] == "[[0.0, 1.0, 2.0], [18.0, 21.0, 24.0]]", lines
    assert lines[1].startswith("MissingKernel target te-2.16.0: transformer_engine/pytorch/triton/pad.py:"), lines
    assert "transformer_engine.common.triton.pad." in lines[1], lines


def test_what_a_fork_prints_while_it_loads_goes_to_stderr(tmp_path: Path) -> None:
    """A fork that logs to stdout at import (TransformerEngine-FL's op manager) must not reach the command's
    stdout before its own start-up: pytest-xdist's workers answer their controller there."""
    import shutil

    released = Path(targets.prepare("te-2.13.0", sources.cache_dir()).root or "")
    tree = tmp_path / "fork"
    shutil.copytree(released / "transformer_engine", tree / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = tree / "transformer_engine" / "__init__.py"
    init.write_text(init.read_text() + "\nprint('[fork] op manager initialized')\n")
    result = exec_in(tmp_path, "--target", f"path:{tree}", "--", sys.executable, "-c", "print('user output')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "user output\n"
    assert "[fork] op manager initialized" in result.stderr
