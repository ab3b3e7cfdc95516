"""The stand-in for TE's compiled extension, `transformer_engine_torch`, built per target.

It is a plain module object holding exactly the names the target's own Python code reads
from the extension, found by reading the target's source (`import transformer_engine_torch
as tex` then `tex.NAME`, and `from transformer_engine_torch import NAME`); there is no
catch-all `__getattr__`, so `hasattr`, `inspect` and `torch.utils.checkpoint` see an
ordinary module. Each name is:

- a kernel with a plain-torch stand-in (`kernels.KERNELS`), compared with references in
  tests/test_kernels.py;
- an enum: `DType` and the FP8 tensor indices from `kernels.ENUMS` with the values of TE's C
  enums, and every other name the source reads members from (`tex.NVTE_QKV_Layout.X`, also
  through `from transformer_engine_torch import X` or `Alias = tex.X`) as an `IntEnum` of
  those members;
- else a compiled kernel without a stand-in: a callable that, when called (never at import),
  raises `MissingKernel` naming the kernel and the TE frame that called it.

The module takes the name the target's build gives its compiled extension (`compiled_name`):
upstream's `transformer_engine_torch`, or a fork's own. A fork may rename the compiled module
and provide `transformer_engine_torch` in Python itself (TransformerEngine-FL, a 2.9.0-based
fork, builds `transformer_engine_torch_nv` and registers a plugin module dispatching to its
backends as `transformer_engine_torch`); then only the compiled module is stood in, and the
fork's own module runs from its files.
"""

from __future__ import annotations

import enum
import functools
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import FidelityError
from harness.targets.cpu_backend import kernels
from harness.targets.cpu_backend.boundary import EXTENSION

# Where the package is not read for it: transformer_engine/jax uses its own extension.
NOT_SCANNED = ("jax",)
# build_tools/pytorch.py of a checkout: the extension it builds, `name="transformer_engine_torch"`.
_BUILT_NAME = re.compile(rf'\bname\s*=\s*["\']({EXTENSION}\w*)["\']')
# A package that provides `transformer_engine_torch` itself, and the compiled module it imports.
_PROVIDED = re.compile(rf'sys\.modules\[\s*["\']{EXTENSION}["\']\s*\]\s*=')
_IMPORTED_OTHER = re.compile(rf"^\s*import ({EXTENSION}_\w+)", re.MULTILINE)


def _package_files(te_dir: Path) -> list[Path]:
    return sorted(path for path in te_dir.rglob("*.py")
                  if path.relative_to(te_dir).parts[0] not in NOT_SCANNED and path.is_file())  # a fork's odd entries


@functools.cache
def compiled_name(te_dir: Path) -> str:
    """The name of the target's compiled PyTorch extension: the one its checkout's
    build_tools/pytorch.py builds; in a tree without build files, the `transformer_engine_torch_*`
    module the package imports where it provides `transformer_engine_torch` itself; else upstream's."""
    build = te_dir.parent / "build_tools" / "pytorch.py"
    if build.is_file() and (built := _BUILT_NAME.findall(build.read_text(errors="replace"))):
        return built[0]
    texts = [path.read_text(errors="replace") for path in _package_files(te_dir)]
    if any(_PROVIDED.search(text) for text in texts):
        others = sorted({name for text in texts for name in _IMPORTED_OTHER.findall(text)})
        if len(others) == 1:
            return others[0]
    return EXTENSION


class MissingKernel(FidelityError):
    """A compiled kernel the CPU backend has no stand-in for was called."""

    def __init__(self, target: str, kernel: str, caller: str, module: str = EXTENSION) -> None:
        self.caller = caller
        super().__init__(target, module, kernel)
        self.args = ((f"target {target}: {caller} called the compiled kernel {module}.{kernel}, "
                      "which has no CPU stand-in"),)


def _calling_te_frame(te_dir: Path) -> str:
    """`file:line in function` of the innermost frame of the target's own source."""
    root = str(te_dir.resolve())
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(root):
            relative = Path(filename).relative_to(te_dir.resolve().parent)
            return f"{relative}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "code outside the target"


def missing_kernel(target: str, name: str, te_dir: Path, module: str) -> Callable[..., Any]:
    def kernel(*_args: Any, **_kwargs: Any) -> Any:
        raise MissingKernel(target, name, _calling_te_frame(te_dir), module)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__module__ = module
    kernel.__doc__ = "Compiled kernel without a CPU stand-in: raises MissingKernel when called."
    return kernel


def _file_uses(text: str, module: str, names: dict[str, set[str]]) -> None:
    """Add one file's reads of the extension `module` to `names` (a regex scan, 20x faster
    than an AST; a mention in a comment adds at most a name that is never called)."""
    import_as = re.compile(rf"^\s*import {module}(?: as (\w+))?\s*$", re.MULTILINE)
    from_import = re.compile(rf"^\s*from {module} import (\([^)]*\)|[^\n]*)", re.MULTILINE)
    local: dict[str, str | None] = {alias or module: None for alias in import_as.findall(text)}
    for group in from_import.findall(text):
        for item in group.strip("()").replace("\n", " ").split(","):
            parts = item.split("#")[0].split()
            if parts and parts[0] != "*":
                names.setdefault(parts[0], set())
                local[parts[-1]] = parts[0]
    for alias in [a for a, imported in local.items() if imported is None]:  # `Format = tex.NVTEFormat`
        for bound, name in re.findall(rf"^\s*(\w+)\s*=\s*{re.escape(alias)}\.(\w+)\s*$", text, re.MULTILINE):
            names.setdefault(name, set())
            local[bound] = name
    for name, imported in local.items():
        for first, second in re.findall(rf"(?<![\w.]){re.escape(name)}\.(\w+)(?:\.(\w+))?", text):
            if imported is None:
                names.setdefault(first, set()).update([second] if second else [])
            else:
                names[imported].add(first)


@functools.cache
def extension_names(te_dir: Path) -> dict[str, frozenset[str]]:
    """Every extension name the target's code reads -> the members read from it. Where a fork
    renamed the compiled module, also what it reads from upstream's name: its own Python
    module there serves upstream's API, which it takes from the compiled one (TE-FL's CUDA
    backend reads the compiled module through a function's return value, which no scan follows)."""
    names: dict[str, set[str]] = {}
    for path in _package_files(te_dir):
        text = path.read_text(errors="replace")
        for module in dict.fromkeys((compiled_name(te_dir), EXTENSION)):
            if module in text:
                _file_uses(text, module, names)
    return {name: frozenset(members) for name, members in sorted(names.items())}


# Attributes of a class or function object that a member access may mean (not enum members).
_NOT_MEMBERS = {"value", "name", "__members__", "default", "__name__"}


def _enum(name: str, members: frozenset[str], module: str) -> type:
    values = sorted(members - _NOT_MEMBERS)
    made = enum.IntEnum(name, {member: index for index, member in enumerate(values)})  # type: ignore[misc]
    made.__module__ = module
    made.__doc__ = f"Stand-in for the extension's enum {name}: the members the target's source reads."
    return made


def build(target: str, te_dir: Path) -> tuple[types.ModuleType, list[str]]:
    """The extension module for one target (named `compiled_name(te_dir)`), and the names it
    holds with CPU stand-ins."""
    name_of_module = compiled_name(te_dir)
    module = types.ModuleType(name_of_module, "TE's compiled extension, stood in by the harness's CPU backend.")
    stood_in = []
    for name, members in extension_names(te_dir).items():
        value: Any
        if name in kernels.KERNELS:
            value = kernels.KERNELS[name]
            stood_in.append(name)
        elif name in kernels.ENUMS:
            value = kernels.ENUMS[name]
        elif members - _NOT_MEMBERS:
            value = _enum(name, members, name_of_module)
        else:
            value = missing_kernel(target, name, te_dir, name_of_module)
        setattr(module, name, value)
    for name, value in kernels.ENUMS.items():  # read through aliases the scan cannot follow
        if not hasattr(module, name):
            setattr(module, name, value)
    return module, stood_in
