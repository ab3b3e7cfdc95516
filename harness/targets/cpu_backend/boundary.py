"""The import boundary of a CPU-backend target: TE's Python as shipped, its shared library not.

`TargetFinder` (first on `sys.meta_path`) serves `transformer_engine` from the target's own
directory; every submodule, package `__init__`s included, is then imported by Python's own
path finder from the target's files. Three things at the boundary are not TE's:

- `transformer_engine/common/__init__.py` runs as shipped with `NVTE_PROJECT_BUILDING=1` set
  while it runs: TE's own switch (set by its setup.py while building) that skips the PyPI
  meta-package sanity check ("Found empty `transformer-engine` meta package") and the
  `ctypes` loading of libtransformer_engine.so, cuDNN and NVRTC;
- in `transformer_engine/pytorch/__init__.py`, the one module-level statement that loads the
  extension's shared object (`load_framework_extension("torch")`, 2.4 on; `_load_library()`
  before) is not executed; the compiled module it would put in `sys.modules` is there
  already (`extension.build`). Every other statement runs, with its own line numbers;
- the distribution metadata `transformer_engine/__init__.py` reads (`__version__`): the
  tree's own dist-info, or for a checkout without one, its version file;
- TE's own Triton kernels (`transformer_engine/common/triton/*.py`): each module runs as
  shipped, then its `@triton.jit` kernels are replaced by their CPU stand-ins
  (`triton_kernels.py`), or by a launch that raises `MissingKernel`.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "transformer_engine"
EXTENSION = "transformer_engine_torch"  # upstream's name for the compiled PyTorch extension
# Module-level calls in pytorch/__init__.py that load the compiled extension.
EXTENSION_LOADERS = ("load_framework_extension", "_load_library")
_BUILDING = {"NVTE_PROJECT_BUILDING": "1", "NVTE_RELEASE_BUILD": "0"}
TRITON_KERNELS = f"{PACKAGE}.common.triton."  # its modules: TE's Triton kernels
# (kernel name, module name) -> what runs when TE launches that Triton kernel.
StandIn = Callable[[str, str], Callable[..., Any]]


class _CommonLoader(importlib.machinery.SourceFileLoader):
    """common/__init__.py as shipped, under TE's own "project building" switch."""

    def exec_module(self, module: ModuleType) -> None:
        saved = {name: os.environ.get(name) for name in _BUILDING}
        os.environ.update(_BUILDING)
        try:
            super().exec_module(module)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _is_extension_loading(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id in EXTENSION_LOADERS)


class _PytorchInitLoader(importlib.machinery.SourceFileLoader):
    """pytorch/__init__.py without its statement that loads the extension's shared object."""

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:  # type: ignore[override]
        tree = ast.parse(data, path)
        tree.body = [ast.copy_location(ast.Pass(), node) if _is_extension_loading(node) else node
                     for node in tree.body]
        return compile(tree, path, "exec", dont_inherit=True)

    def get_code(self, fullname: str) -> Any:
        # Always from the source: a cached .pyc would still load the extension.
        return self.source_to_code(self.get_data(self.path), self.path)


class _TritonKernelsLoader(importlib.machinery.SourceFileLoader):
    """A module of TE's Triton kernels as shipped, its JIT kernels then stood in."""

    def __init__(self, fullname: str, path: str, stand_in: StandIn) -> None:
        super().__init__(fullname, path)
        self.stand_in = stand_in

    def exec_module(self, module: ModuleType) -> None:
        # Here, not at the top: the CLI imports this module for its constants and must not import torch.
        from harness.targets.cpu_backend import triton_kernels

        super().exec_module(module)
        for name, value in list(vars(module).items()):
            if triton_kernels.is_jit_kernel(value):
                setattr(module, name, triton_kernels.Launch(name, self.stand_in(name, module.__name__)))


class _Distribution(importlib.metadata.Distribution):
    """A checkout's metadata when it has no dist-info: its name and version file."""

    def __init__(self, version: str) -> None:
        self._metadata = f"Metadata-Version: 2.1\nName: transformer_engine\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._metadata if filename == "METADATA" else None

    def locate_file(self, path: Any) -> Path:
        return Path(str(path))


class TargetFinder(importlib.abc.MetaPathFinder):
    """Serves the target's `transformer_engine` package and its distribution metadata."""

    def __init__(self, te_dir: Path, version: str, triton_stand_in: StandIn | None = None) -> None:
        self.te_dir = te_dir
        self.version = version
        self.triton_stand_in = triton_stand_in

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if fullname == PACKAGE:
            return importlib.util.spec_from_file_location(
                PACKAGE, self.te_dir / "__init__.py", submodule_search_locations=[str(self.te_dir)])
        loaders = {f"{PACKAGE}.common": _CommonLoader, f"{PACKAGE}.pytorch": _PytorchInitLoader}
        if fullname.startswith(TRITON_KERNELS) and fullname.count(".") == TRITON_KERNELS.count("."):
            source = self.te_dir.joinpath(*fullname.split(".")[1:]).with_suffix(".py")
            if self.triton_stand_in is None or not source.is_file():
                return None
            triton_loader = _TritonKernelsLoader(fullname, str(source), self.triton_stand_in)
            return importlib.util.spec_from_file_location(fullname, source, loader=triton_loader)
        if fullname in loaders:
            init = self.te_dir / fullname.rpartition(".")[2] / "__init__.py"
            loader = loaders[fullname](fullname, str(init))
            return importlib.util.spec_from_file_location(fullname, init, loader=loader,
                                                          submodule_search_locations=[str(init.parent)])
        return None

    def find_distributions(self, context: Any = None) -> Iterator[Any]:
        name = (getattr(context, "name", None) or "").replace("-", "_").lower()
        if name != PACKAGE:
            return iter(())
        found = sorted(self.te_dir.parent.glob("transformer_engine-*.dist-info"))
        if found:
            return iter([importlib.metadata.PathDistribution(found[0])])
        return iter([_Distribution(self.version)])
