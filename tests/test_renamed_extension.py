"""A fork that renames TE's compiled extension and provides `transformer_engine_torch` in
Python itself (as TransformerEngine-FL does: `transformer_engine_torch_nv`, under a plugin
module): the CPU backend stands in only the compiled module, under the fork's name, and the
fork's own module runs from its files. Found from the checkout's build_tools/pytorch.py, or,
in a tree without build files, from the package's own registration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import targets
from tests.test_releases import _exec

# The fork's own `transformer_engine_torch`: upstream's API, forwarded from its compiled module,
# with a mark of its own, registered before TE's pytorch package imports it.
FORK_MODULE = '''"""The fork's Python front of its compiled extension."""
import sys
import types

import transformer_engine_torch_nv

front = types.ModuleType("transformer_engine_torch")
front.__dict__.update({k: v for k, v in vars(transformer_engine_torch_nv).items() if not k.startswith("__")})
front.FORK_FRONT = __file__
sys.modules["transformer_engine_torch"] = front
'''
CHECK = """
import json, sys
import torch
import transformer_engine.pytorch as te
front, native = sys.modules["transformer_engine_torch"], sys.modules.get("transformer_engine_torch_nv")
norm = te.ops.RMSNorm(8)
y = norm(torch.randn(4, 8, requires_grad=True))
y.sum().backward()
print(json.dumps({"front": getattr(front, "FORK_FRONT", None), "native": native.__name__ if native else None,
                  "native_has_gemm": hasattr(native, "generic_gemm")}))
"""


def _renaming_fork(root: Path, cache: Path, build_files: bool) -> Path:
    source = Path(targets.prepare("te-2.13.0", cache).root or "") / "transformer_engine"
    shutil.copytree(source, root / "transformer_engine", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "transformer_engine" / "fork_front.py").write_text(FORK_MODULE)
    common = root / "transformer_engine" / "common" / "__init__.py"
    common.write_text(common.read_text() + "\nimport transformer_engine.fork_front  # noqa: E402,F401\n")
    if build_files:
        (root / "build_tools").mkdir()
        (root / "build_tools" / "pytorch.py").write_text(
            'def setup_pytorch_extension():\n    return CppExtension(name="transformer_engine_torch_nv", sources=[])\n')
    return root


@pytest.mark.parametrize("build_files", [True, False], ids=["checkout", "package-only"])
def test_only_the_renamed_compiled_module_is_stood_in(tmp_path: Path, cache: Path, build_files: bool) -> None:
    fork = _renaming_fork(tmp_path / "fork", cache, build_files)
    prepared = targets.prepare(f"path:{fork}", cache)
    result = _exec(prepared, CHECK)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["front"] == str(fork / "transformer_engine" / "fork_front.py")  # the fork's own module, run
    assert found["native"] == "transformer_engine_torch_nv" and found["native_has_gemm"]  # ours, by its name
