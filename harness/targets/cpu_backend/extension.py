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

EXTENSION = "transformer_engine_torch"
# Where the PyTorch extension is read (transformer_engine/jax uses its own extension).
SCANNED = ("pytorch", "debug")


class MissingKernel(FidelityError):
    """A compiled kernel the CPU backend has no stand-in for was called."""

    def __init__(self, target: str, kernel: str, caller: str) -> None:
        self.caller = caller
        super().__init__(target, EXTENSION, kernel)
        self.args = ((f"target {target}: {caller} called the compiled kernel {EXTENSION}.{kernel}, "
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


def _missing_kernel(target: str, name: str, te_dir: Path) -> Callable[..., Any]:
    def kernel(*_args: Any, **_kwargs: Any) -> Any:
        raise MissingKernel(target, name, _calling_te_frame(te_dir))

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__module__ = EXTENSION
    kernel.__doc__ = "Compiled kernel without a CPU stand-in: raises MissingKernel when called."
    return kernel


_IMPORT_AS = re.compile(rf"^\s*import {EXTENSION}(?: as (\w+))?\s*$", re.MULTILINE)
_FROM_IMPORT = re.compile(rf"^\s*from {EXTENSION} import (\([^)]*\)|[^\n]*)", re.MULTILINE)


def _file_uses(text: str, names: dict[str, set[str]]) -> None:
    """Add one file's reads of the extension to `names` (a regex scan, 20x faster than an
    AST; a mention in a comment adds at most a name that is never called)."""
    local: dict[str, str | None] = {alias or EXTENSION: None for alias in _IMPORT_AS.findall(text)}
    for group in _FROM_IMPORT.findall(text):
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
    """Every extension name the target's PyTorch code reads -> the members read from it."""
    names: dict[str, set[str]] = {}
    for part in SCANNED:
        for path in sorted((te_dir / part).rglob("*.py")):
            text = path.read_text(errors="replace")
            if EXTENSION in text:
                _file_uses(text, names)
    return {name: frozenset(members) for name, members in sorted(names.items())}


# Attributes of a class or function object that a member access may mean (not enum members).
_NOT_MEMBERS = {"value", "name", "__members__", "default", "__name__"}


def _enum(name: str, members: frozenset[str]) -> type:
    values = sorted(members - _NOT_MEMBERS)
    made = enum.IntEnum(name, {member: index for index, member in enumerate(values)})  # type: ignore[misc]
    made.__module__ = EXTENSION
    made.__doc__ = f"Stand-in for the extension's enum {name}: the members the target's source reads."
    return made


def build(target: str, te_dir: Path) -> tuple[types.ModuleType, list[str]]:
    """The extension module for one target, and the names it holds with CPU stand-ins."""
    module = types.ModuleType(EXTENSION, "TE's compiled extension, stood in by the harness's CPU backend.")
    stood_in = []
    for name, members in extension_names(te_dir).items():
        value: Any
        if name in kernels.KERNELS:
            value = kernels.KERNELS[name]
            stood_in.append(name)
        elif name in kernels.ENUMS:
            value = kernels.ENUMS[name]
        elif members - _NOT_MEMBERS:
            value = _enum(name, members)
        else:
            value = _missing_kernel(target, name, te_dir)
        setattr(module, name, value)
    for name, value in kernels.ENUMS.items():  # read through aliases the scan cannot follow
        if not hasattr(module, name):
            setattr(module, name, value)
    return module, stood_in
