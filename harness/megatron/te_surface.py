"""The part of TE that Megatron sees, on a loaded CPU-backend target.

Megatron imports some TE names at module level (it subclasses TE's module classes,
reads `__version__`, imports the FP8 state manager ...) and probes about 30 more inside
`try/except ImportError` or `hasattr`. This module provides the first set and makes every
other TE name read as *absent*, the way Megatron expects on an install without it:

- the TE modules and classes the target loaded for real (ops, norm ops, te.pytorch.RMSNorm,
  common.recipe) are what Megatron gets;
- the names below that need the compiled extension are `StrictModule` stand-ins; their
  classes refuse to be built, with one clear message, so they can be subclassed at import
  but never used on the CPU;
- a missing name in a stand-in raises `MissingName`, which is a `FidelityError` and also an
  `AttributeError`: `hasattr` says False and `from x import y` raises ImportError;
- importing any other `transformer_engine.*` module, or `triton`, fails as "not installed".

Every such miss is recorded (`ProbeLog`), with the Megatron line that probed, so the target
description lists each probe that found a stand-in missing.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

from harness.errors import FidelityError, TargetLoadError
from harness.targets.cpu_backend.standins import StrictModule
from harness.targets.loader import PACKAGE_SHELLS, LoadedTarget

# Imported by megatron.core at module level; absent here, as on a machine without it.
ABSENT_PACKAGES = ("triton",)


class MissingName(FidelityError, AttributeError):
    """A name a stand-in does not provide: fatal where used, "absent" to a probe."""


@dataclass
class ProbeLog:
    """Each TE name or module Megatron asked for and did not find, with where it asked."""

    megatron_root: Path
    misses: dict[str, str] = field(default_factory=dict)  # "module.name" -> megatron file:line

    def record(self, what: str) -> None:
        root = str(self.megatron_root.resolve())
        where = "?"
        for frame in reversed(traceback.extract_stack()):
            if frame.filename.startswith(root):
                where = f"{Path(frame.filename).relative_to(root)}:{frame.lineno}"
                break
        self.misses.setdefault(what, where)

    @property
    def description(self) -> str:
        if not self.misses:
            return "no Megatron probe found a TE name missing"
        return "Megatron probes that found TE names absent: " + ", ".join(
            f"{what} ({where})" for what, where in sorted(self.misses.items())
        )


class _ProbedShell(types.ModuleType):
    """A package shell (loader.PACKAGE_SHELLS) that records the names Megatron misses.

    Submodules the target ships are left to the import system (a plain AttributeError);
    `_AbsentModules` then decides whether they may load."""

    _probe_log: ProbeLog
    _probe_target: str

    def __getattr__(self, symbol: str) -> Any:
        if symbol.startswith("__") and symbol.endswith("__"):
            raise AttributeError(symbol)
        path = Path(self.__path__[0]) / symbol
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            raise AttributeError(symbol)
        self._probe_log.record(f"{self.__name__}.{symbol}")
        raise MissingName(self._probe_target, self.__name__, symbol)


class _AbsentModules(importlib.abc.MetaPathFinder):
    """Makes every TE module not already provided, and each package in ABSENT_PACKAGES,
    fail to import as not installed. TE modules load only through the harness's loader."""

    def __init__(self, log: ProbeLog) -> None:
        self.log = log

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        top = fullname.partition(".")[0]
        if top == "transformer_engine" or top in ABSENT_PACKAGES:
            self.log.record(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def _unbuildable(qualname: str, base: type = torch.nn.Module) -> type:
    """A class Megatron can subclass at import; building one says why it cannot run here."""

    def __init__(self: Any, *_args: Any, **_kwargs: Any) -> None:
        raise NotImplementedError(
            f"{qualname} needs TE's compiled extension; on the CPU backend only TE's RMSNorm/LayerNorm "
            "(ops and te.pytorch modules) and the pass-through ops run"
        )

    module, _, name = qualname.rpartition(".")
    return type(name, (base,), {"__init__": __init__, "__module__": module, "__doc__": "Stand-in: refuses to build."})


def _refuse(qualname: str) -> Any:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"{qualname} needs TE's compiled extension (not on the CPU backend)")

    refused.__name__ = qualname.rpartition(".")[2]
    return refused


@contextlib.contextmanager
def _fp8_model_init(enabled: bool = False, **_kwargs: Any) -> Iterator[None]:
    if enabled:
        raise NotImplementedError("FP8 parameters are not available on the CPU backend")
    yield


# Module-level imports of megatron.core (0.17-0.19) that need the extension, by TE module.
MODULE_CLASSES = ("Linear", "LayerNormLinear", "GroupedLinear", "DotProductAttention", "LayerNormMLP",
                  "TransformerLayer")
DISTRIBUTED = ("CudaRNGStatesTracker",)
DISTRIBUTED_FUNCTIONS = ("activation_recompute_forward", "checkpoint", "gather_along_first_dim")
ROUTER_FUNCTIONS = ("fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_topk_with_score_function")


def _standins(target: LoadedTarget) -> dict[str, dict[str, Any]]:
    """TE module -> the names it provides to Megatron (beyond what the target loaded)."""
    pytorch = {name: _unbuildable(f"transformer_engine.pytorch.{name}") for name in MODULE_CLASSES}
    # Megatron subclasses te.pytorch.RMSNorm at import; where TE's own does not load on the CPU
    # backend (before 2.13), a class that refuses to build keeps the `megatron` wrapper usable.
    for name in ("RMSNorm", "LayerNorm"):
        if name not in target.te_modules:
            pytorch[name] = _unbuildable(f"transformer_engine.pytorch.{name}")
    distributed: dict[str, Any] = {name: _unbuildable(f"transformer_engine.pytorch.distributed.{name}", object)
                                   for name in DISTRIBUTED}
    distributed.update({name: _refuse(f"transformer_engine.pytorch.distributed.{name}")
                        for name in DISTRIBUTED_FUNCTIONS})
    quantization = sys.modules["transformer_engine.pytorch.quantization" if "transformer_engine.pytorch.quantization"
                               in sys.modules else "transformer_engine.pytorch.fp8"]
    fp8 = {"FP8GlobalStateManager": quantization.FP8GlobalStateManager, "fp8_autocast": quantization.autocast,
           "fp8_model_init": _fp8_model_init}
    tensor = {"QuantizedTensor": type("QuantizedTensor", (torch.Tensor,), {"__doc__": "Type stand-in: FP8 is off."})}
    surface = {"transformer_engine.pytorch": pytorch, "transformer_engine.pytorch.distributed": distributed,
               "transformer_engine.pytorch.fp8": fp8, "transformer_engine.pytorch.tensor": tensor}
    if target.te_dir is not None and (target.te_dir / "pytorch/router.py").is_file():
        # megatron imports these unguarded once TE >= 2.7 (MoE routing; never on this path).
        surface["transformer_engine.pytorch.router"] = {
            name: _refuse(f"transformer_engine.pytorch.router.{name}") for name in ROUTER_FUNCTIONS
        }
    return surface


@dataclass
class Surface:
    log: ProbeLog
    finder: _AbsentModules
    provided: list[str]


def install(target: LoadedTarget, megatron_root: Path) -> Surface:
    """Make TE, as Megatron sees it, out of the loaded target; call before importing Megatron."""
    log = ProbeLog(megatron_root)
    provided: list[str] = []
    try:
        Version(target.prepared.version)
    except InvalidVersion:
        raise TargetLoadError(f"target {target.prepared.spec}: Megatron reads TE's version, and this tree has none "
                              "(no VERSION.txt or dist-info)") from None
    te = sys.modules["transformer_engine"]
    te.__version__ = target.prepared.version
    for name, symbols in _standins(target).items():
        module = sys.modules.get(name)
        if module is None:
            module = StrictModule(name, target.prepared.spec, {}, {})
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, module)
        for symbol, value in symbols.items():
            if symbol not in module.__dict__:
                module.__dict__[symbol] = value
                provided.append(f"{name}.{symbol}")
    for name in PACKAGE_SHELLS:
        module = sys.modules.get(name)
        if module is not None and type(module) is types.ModuleType:
            module.__class__ = _ProbedShell
            module._probe_log, module._probe_target = log, target.prepared.spec
    StrictModule.probe_hook = lambda target_spec, module, symbol: _missing(log, target_spec, module, symbol)
    finder = _AbsentModules(log)
    sys.meta_path.insert(0, finder)
    return Surface(log, finder, provided)


def _missing(log: ProbeLog, target_spec: str, module: str, symbol: str) -> MissingName:
    log.record(f"{module}.{symbol}")
    return MissingName(target_spec, module, symbol)
