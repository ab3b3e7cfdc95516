"""Every release from 2.13.0 to 2.20.2 loads on the CPU backend, the minimal scenario
fails in fuser.py before the fix (2.16.0) and completes from it on, and a target
that asks for a name the backend lacks fails with the target, module and symbol."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest

from harness import targets
from harness.targets import sources
from harness.targets.cpu_backend.standins import standin_modules
from harness.targets.probing import probe

# Every transformer-engine release on the package index in [2.13.0, 2.20.2].
RELEASES = (
    "2.13.0", "2.14.0", "2.14.1", "2.15.0", "2.16.0", "2.16.1",
    "2.17.0", "2.17.1", "2.18.0", "2.19.0", "2.20.2",
)
FIXED_IN = (2, 16, 0)  # NVIDIA/TransformerEngine PR #2919


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_release_minimal_scenario(version: str, cache: Path) -> None:
    report = probe(targets.prepare(f"te-{version}", cache), minimal=True)
    assert report["load_error"] is None, report["load_error"]
    outcome = report["minimal"]
    if _version(version) < FIXED_IN:
        assert not outcome["completed"], outcome
        assert outcome["error"]["type"] == "RuntimeError", outcome["error"]
        assert outcome["error"]["location"].startswith("transformer_engine/pytorch/ops/fuser.py:"), outcome["error"]
    else:
        assert outcome["completed"], outcome["error"]


def test_fidelity_error_names_target_module_and_symbol(cache: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    source = Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine"
    shutil.copytree(source, broken / "transformer_engine", ignore=shutil.ignore_patterns("__pycache__"))
    fuser = broken / sources.FUSER_RELPATH
    fuser.write_text(fuser.read_text() + "\nfrom ..quantization import NoSuchSymbolForTest\n")
    prepared = targets.prepare(f"path:{broken}", cache)
    error = probe(prepared, minimal=True)["load_error"]
    assert error is not None
    assert prepared.spec in error
    assert "transformer_engine.pytorch.quantization" in error
    assert "NoSuchSymbolForTest" in error


def test_standins_only_for_modules_the_release_ships(cache: Path) -> None:
    # No TE code runs here: standin_modules only looks at which files a tree has.
    recipe = types.ModuleType("recipe")
    old_dir = Path(targets.prepare("te-2.5.0", cache).root or "") / "transformer_engine"
    new_dir = Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine"
    old = standin_modules("te-2.5.0", recipe, old_dir)
    new = standin_modules("te-2.13.0", recipe, new_dir)
    # 2.5.0: fp8.py imports the extension and quantization.py does not exist yet.
    assert "transformer_engine.pytorch.fp8" in old
    assert "transformer_engine.pytorch.quantization" not in old
    assert "transformer_engine.pytorch.quantized_tensor" not in old
    # 2.13.0: fp8.py is a pure-Python shim over quantization, so it loads real.
    assert "transformer_engine.pytorch.fp8" not in new
    assert "transformer_engine.pytorch.quantization" in new
    assert "transformer_engine.pytorch.tensor.quantized_tensor" not in new
