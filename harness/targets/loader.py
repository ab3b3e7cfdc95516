"""Import a prepared target into the current process.

On the CPU backend the package `__init__`s (which load the compiled library) are
bypassed: empty package shells point at the target's own directories, so every real
module (fuser.py, op.py, sequential.py, the pass-through ops, common/recipe) is
imported from the target's files exactly as shipped. The stand-ins from
`cpu_backend.standins` fill the few modules that need the extension.

One process holds one target: two TE versions cannot share an interpreter.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.errors import FidelityError, TargetLoadError
from harness.targets import PreparedTarget
from harness.targets.cpu_backend import kernels
from harness.targets.cpu_backend.ops import make_cpu_ops
from harness.targets.cpu_backend.standins import StrictModule, decode_cudnn_version, standin_modules

PACKAGE_SHELLS = (
    "transformer_engine",
    "transformer_engine.common",
    "transformer_engine.pytorch",
    "transformer_engine.pytorch.ops",
    "transformer_engine.pytorch.ops.basic",
    "transformer_engine.pytorch.module",
    "transformer_engine.debug",
    "transformer_engine.debug.pytorch",
)
# TE's own pass-through ops, by class name and the module that holds each, newest name first.
TE_OPS = {
    "MakeExtraOutput": ("make_extra_output",),
    "AddExtraInput": ("add_extra_input", "add_in_place"),
    "Identity": ("identity",),
    "Reshape": ("reshape",),
    "ConstantScale": ("constant_scale",),
}
OLD_NAMES = {"AddExtraInput": "AddInPlace"}
# TE's own norm ops, which run as shipped on the kernel stand-ins (cpu_backend/kernels.py):
# op name -> (ops/basic module, module/ file holding the te.pytorch module of that name, kernels it calls).
TE_NORM_OPS = {
    "RMSNorm": ("rmsnorm", "rmsnorm", ("rmsnorm_fwd", "rmsnorm_bwd")),
    "LayerNorm": ("layer_norm", "layernorm", ("layernorm_fwd", "layernorm_bwd")),
}


@dataclass
class LoadedTarget:
    prepared: PreparedTarget
    ops: dict[str, Any]  # op name -> class; plus "Sequential" and "BasicOperation"
    te_ops: list[str]
    backend_ops: list[str]
    missing_ops: dict[str, str] = field(default_factory=dict)  # op name -> why it is absent
    te_dir: Path | None = None
    features: frozenset[str] = frozenset()  # op features of this release (see `op_features`)
    te_modules: dict[str, Any] = field(default_factory=dict)  # te.pytorch module classes (RMSNorm, LayerNorm)
    kernel_standins: list[str] = field(default_factory=list)  # extension functions the CPU backend replaces
    own_op_fallbacks: dict[str, str] = field(default_factory=dict)  # op name -> why TE's own op could not run

    @property
    def description(self) -> str:
        te = ", ".join(self.te_ops)
        if self.prepared.backend == "native":
            return f"native TE: every op is TE's own ({te})"
        text = f"TE's own: {te}; CPU backend: {', '.join(self.backend_ops)}"
        if self.te_modules:
            text += f"; te.pytorch modules: {', '.join(self.te_modules)}"
        if self.kernel_standins:
            text += f"; kernels stood in: {', '.join(self.kernel_standins)} (and utils._empty_tensor on the CPU)"
        for name, why in self.own_op_fallbacks.items():
            text += f"; {name} is the CPU backend's ({why})"
        return text


def _shell(name: str, directory: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(directory)]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [str(directory)]
    module.__package__ = name
    return module


def _install(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def _importing_line(exc: BaseException, te_dir: Path) -> str:
    """`file:line` of the deepest frame of the target's own source in the traceback (or
    the file a SyntaxError is in): the statement that failed, as the fork's author sees it."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_relative(exc.filename, te_dir)}:{exc.lineno}"
    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if Path(frame.f_code.co_filename).resolve().is_relative_to(te_dir.resolve()):
            where = f"{_relative(frame.f_code.co_filename, te_dir)}:{line}"
    return where


def _relative(filename: str, te_dir: Path) -> str:
    path = Path(filename).resolve()
    return str(path.relative_to(te_dir.resolve().parent)) if path.is_relative_to(te_dir.resolve().parent) else filename


def _import(target: str, name: str, te_dir: Path) -> types.ModuleType:
    """Import one of the target's modules; any failure becomes one TargetLoadError naming
    the target's file and line that failed, the module and the missing name."""
    try:
        return importlib.import_module(name)
    except FidelityError as exc:
        where = _importing_line(exc, te_dir)
        raise TargetLoadError(f"target {target}: {where or name} needs {exc.module}.{exc.symbol}, which the CPU "
                              "backend does not stand in for; declare it under [standins] in a fork config") from None
    except ModuleNotFoundError as exc:
        where = _importing_line(exc, te_dir) or name
        raise TargetLoadError(f"target {target}: {where} imports module {exc.name}, which neither the target, "
                              "the environment nor the CPU backend provides") from None
    except ImportError as exc:
        where = _importing_line(exc, te_dir) or name
        symbol = f"{exc.name}.{_missing_symbol(exc)}" if exc.name and _missing_symbol(exc) else str(exc)
        raise TargetLoadError(f"target {target}: {where} cannot import {symbol} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 — a SyntaxError or error at import time is the target's load error
        where = _importing_line(exc, te_dir) or name
        raise TargetLoadError(f"target {target}: importing {name} failed at {where}: "
                              f"{type(exc).__name__}: {exc}") from None


def _missing_symbol(exc: ImportError) -> str | None:
    match = re.match(r"cannot import name '([^']+)'", str(exc))
    return match.group(1) if match else None


def _forget_target() -> None:
    """Drop a half-loaded target, so the next attempt reports its own error again."""
    for name in [n for n in sys.modules if n == "transformer_engine" or n.startswith("transformer_engine.")]:
        del sys.modules[name]


def _fork_standins(prepared: PreparedTarget, standins: dict[str, types.ModuleType], te_dir: Path) -> None:
    """Add a fork config's extra stand-in symbols. Real modules win: a module the target
    ships as real source (or the environment provides) is never stood in."""
    for module_name, symbols in prepared.extra_standins.items():
        if module_name not in standins:
            shipped = module_name.startswith("transformer_engine.") and _ships(te_dir, module_name)
            if shipped or (not module_name.startswith("transformer_engine") and importlib.util.find_spec(
                    module_name.split(".")[0]) is not None):
                raise TargetLoadError(f"target {prepared.spec}: fork config stands in {module_name}, but the "
                                      "target or the environment has the real module; remove it from [standins]")
            standins[module_name] = StrictModule(module_name, prepared.spec, {}, {})
        standins[module_name].__dict__.update({symbol: _standin_value(module_name, symbol, kind)
                                               for symbol, kind in symbols.items()})


def _ships(te_dir: Path, module_name: str) -> bool:
    path = te_dir.joinpath(*module_name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _standin_value(module_name: str, symbol: str, kind: str) -> Any:
    if kind == "class":
        return type(symbol, (), {"__module__": module_name})
    if kind == "noop":
        return lambda *_args, **_kwargs: None
    return {"none": None, "false": False, "true": True}[kind]


def _let_real_submodules_load(standins: dict[str, types.ModuleType], te_dir: Path) -> None:
    """A stood-in package (tensor/) still lets the target's real submodules import from its
    directory, so a fork's own `tensor/npu_tensor.py` is the fork's, not ours."""
    for name, module in standins.items():
        directory = te_dir.joinpath(*name.split(".")[1:])
        if name.startswith("transformer_engine.") and (directory / "__init__.py").is_file():
            module.__dict__["__path__"] = [str(directory)]


def op_features(ops: dict[str, Any]) -> frozenset[str]:
    """What the release's own classes can do, read off them (not off a version number,
    so a fork that backports a feature has it):
    - in_place_kwarg: the extra-tensor ops take `in_place` (2.7 on; before, AddInPlace was
      in place by design and MakeExtraOutput accumulated in place);
    - extra_tensors_across_groups: Sequential passes extra inputs and outputs between
      fuser groups (2.7 on)."""
    found = set()
    make_extra_output = ops.get("MakeExtraOutput")
    if make_extra_output is not None and "in_place" in inspect.signature(make_extra_output.__init__).parameters:
        found.add("in_place_kwarg")
    if "num_extra_inputs" in inspect.getsource(ops["Sequential"].forward):
        found.add("extra_tensors_across_groups")
    return frozenset(found)


def load_cpu(prepared: PreparedTarget) -> LoadedTarget:
    if any(name == "transformer_engine" or name.startswith("transformer_engine.") for name in sys.modules):
        raise TargetLoadError("a transformer_engine is already imported in this process; load one target per process")
    try:
        return _load_cpu(prepared)
    except BaseException:
        _forget_target()
        raise


def _load_cpu(prepared: PreparedTarget) -> LoadedTarget:
    te_dir = Path(prepared.root or "") / "transformer_engine"
    for name in PACKAGE_SHELLS:
        _install(name, _shell(name, te_dir.joinpath(*name.split(".")[1:])))
    recipe = _import(prepared.spec, "transformer_engine.common.recipe", te_dir)
    standins: dict[str, types.ModuleType] = dict(standin_modules(prepared.spec, recipe, te_dir))
    _let_real_submodules_load(standins, te_dir)
    _fork_standins(prepared, standins, te_dir)
    for name, module in standins.items():
        _install(name, module)
    op_module = _import(prepared.spec, "transformer_engine.pytorch.ops.op", te_dir)
    _import(prepared.spec, "transformer_engine.pytorch.ops.fuser", te_dir)
    sequential = _import(prepared.spec, "transformer_engine.pytorch.ops.sequential", te_dir)

    ops: dict[str, Any] = {"Sequential": sequential.Sequential, "BasicOperation": op_module.BasicOperation}
    te_ops, missing = [], {}
    for op_name, module_names in TE_OPS.items():
        found = _find_op(prepared, te_dir, op_name, module_names)
        if found is None:
            missing[op_name] = f"{prepared.spec} has no ops/basic/{module_names[0]}.py"
            continue
        ops[op_name] = found
        te_ops.append(op_name if found.__name__ == op_name else f"{op_name} (as {found.__name__})")
    backend = make_cpu_ops(op_module.BasicOperation)
    own, modules, fallbacks = _load_te_norm_ops(prepared.spec, te_dir)
    ops.update({**backend, **own})
    te_ops += list(own)
    # What ops/__init__.py would export: TE's own classes only, never the backend's,
    # so that `te.pytorch.ops.X` (module/rmsnorm.py, Megatron) finds what TE itself provides.
    for name in ("Sequential", "BasicOperation", *[n for n in TE_OPS if n in ops], *own):
        setattr(sys.modules["transformer_engine.pytorch.ops"], name, ops[name])
    for name, cls in modules.items():
        setattr(sys.modules["transformer_engine.pytorch"], name, cls)
    stood_in = [f"transformer_engine_torch.{k}" for name in own for k in TE_NORM_OPS[name][2]]
    assert all(k.rpartition(".")[2] in kernels.KERNELS for k in stood_in)
    return LoadedTarget(prepared, ops, te_ops, [n for n in backend if n not in own], missing, te_dir,
                        op_features(ops), te_modules=modules, kernel_standins=stood_in, own_op_fallbacks=fallbacks)


def _load_te_norm_ops(spec: str, te_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """TE's own RMSNorm/LayerNorm ops and te.pytorch modules, on the kernel stand-ins.

    A release whose norm op needs more than the CPU backend provides keeps the backend's
    op for that name; the reason is returned so the target description can say it.
    """
    # 2.20's utils.py imports this from the package root, whose real __init__ loads the library.
    sys.modules["transformer_engine.common"].decode_cudnn_version = decode_cudnn_version
    own: dict[str, Any] = {}
    modules: dict[str, Any] = {}
    fallbacks: dict[str, str] = {}
    for name, (op_file, module_file, _kernels) in TE_NORM_OPS.items():
        try:
            own[name] = getattr(_import(spec, f"transformer_engine.pytorch.ops.basic.{op_file}", te_dir), name)
        except TargetLoadError as exc:
            fallbacks[name] = str(exc).removeprefix(f"target {spec}: ")
            continue
        setattr(sys.modules["transformer_engine.pytorch.ops"], name, own[name])
        if (te_dir / "pytorch/module" / f"{module_file}.py").is_file():
            try:
                modules[name] = getattr(_import(spec, f"transformer_engine.pytorch.module.{module_file}", te_dir), name)
            except TargetLoadError as exc:
                fallbacks[f"te.pytorch.{name}"] = str(exc).removeprefix(f"target {spec}: ")
    utils = sys.modules.get("transformer_engine.pytorch.utils")
    if own and utils is not None and hasattr(utils, "_empty_tensor"):
        # clear_tensor_data (the ops' backward) frees saved tensors by pointing them at an
        # empty tensor that utils allocates with `.cuda()`; on the CPU backend it is a CPU one.
        utils._empty_tensor = _empty_cpu_tensor
    return own, modules, fallbacks


@functools.cache
def _empty_cpu_tensor() -> torch.Tensor:
    return torch.Tensor()


def _find_op(prepared: PreparedTarget, te_dir: Path, op_name: str, module_names: tuple[str, ...]) -> Any:
    """TE's own class for one of our op names: where a fork config renames it, that
    module and class; else the newest module and name the target has."""
    renamed = prepared.renamed_ops.get(op_name)
    if renamed:
        module_name, _, class_name = renamed.rpartition(":")
        candidates = [module_name] if module_name else list(module_names)
    else:
        class_name, candidates = "", list(module_names)
    for module_name in candidates:
        if (te_dir / "pytorch/ops/basic" / f"{module_name}.py").is_file():
            basic = _import(prepared.spec, f"transformer_engine.pytorch.ops.basic.{module_name}", te_dir)
            for name in (class_name,) if class_name else (op_name, OLD_NAMES.get(op_name, op_name)):
                if hasattr(basic, name):
                    return getattr(basic, name)
            raise TargetLoadError(f"target {prepared.spec}: ops/basic/{module_name}.py has no class "
                                  f"{class_name or op_name}" + (" (named in the fork config's [renamed_ops])"
                                                                if class_name else ""))
    if renamed:
        raise TargetLoadError(f"target {prepared.spec}: the fork config renames {op_name} to {renamed}, "
                              "but that module is not in ops/basic/")
    return None


def load_native(prepared: PreparedTarget) -> LoadedTarget:
    """The installed TE, with its own kernels; a patched copy goes first on sys.path."""
    if prepared.patch and prepared.root:
        sys.path.insert(0, prepared.root)
    try:
        te = importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # noqa: BLE001 — a broken native install is a load status, not a crash
        raise TargetLoadError(f"target {prepared.spec}: import transformer_engine.pytorch failed: {exc}") from None
    names = [*TE_OPS, "RMSNorm", "LayerNorm", "BasicLinear", "Bias", "GELU", "ReLU", "SwiGLU"]
    ops = {"Sequential": te.ops.Sequential, "BasicOperation": te.ops.BasicOperation}
    missing = {}
    for name in names:
        if hasattr(te.ops, name):
            ops[name] = getattr(te.ops, name)
        else:
            missing[name] = f"te.ops has no {name}"
    te_dir = Path(te.__file__ or "").resolve().parent.parent
    return LoadedTarget(prepared, ops, [n for n in names if n in ops], [], missing, te_dir, op_features(ops))


_LOADED: LoadedTarget | None = None


def loaded() -> LoadedTarget | None:
    """The target this process loaded (Megatron is imported on top of it)."""
    return _LOADED


def load(prepared: PreparedTarget) -> LoadedTarget:
    global _LOADED
    # Never write bytecode into a source under test (path: trees, the installed TE), even
    # where PYTHONDONTWRITEBYTECODE is unset.
    sys.dont_write_bytecode = True
    if prepared.patch_status == "conflict":
        raise TargetLoadError(f"target {prepared.spec}: patch {prepared.patch} does not apply (conflict)")
    _LOADED = load_native(prepared) if prepared.backend == "native" else load_cpu(prepared)
    return _LOADED
