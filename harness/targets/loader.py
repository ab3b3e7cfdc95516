"""Import a prepared target into the current process.

On the CPU backend the whole `transformer_engine` package is imported from the target's
files as shipped, package `__init__`s included (`cpu_backend/boundary.py` says exactly what
happens at the boundary to the shared library). Stood in is only the compiled extension,
`transformer_engine_torch` (`cpu_backend/extension.py`, its kernels `cpu_backend/kernels.py`),
and the device TE asks about (`cpu_backend/device.py`, a device without FP8).
So `te.ops` (the fuser, every basic and fused op, the fusion passes) and `te.pytorch`'s
modules are TE's own.

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
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cases.ops.database import DATABASE_OPS
from harness.engine.frames import innermost_te_frame
from harness.errors import FidelityError, TargetLoadError
from harness.targets import PreparedTarget
from harness.targets.cpu_backend import boundary, device, extension, triton_kernels
from harness.targets.cpu_backend.strict import StrictModule
from harness.torch_version import torch_version

# TE's own pass-through ops, by class name and the module that holds each, newest name first.
TE_OPS = {
    "MakeExtraOutput": ("make_extra_output",),
    "AddExtraInput": ("add_extra_input", "add_in_place"),
    "Identity": ("identity",),
    "Reshape": ("reshape",),
    "ConstantScale": ("constant_scale",),
}
OLD_NAMES = {"AddExtraInput": "AddInPlace"}
# TE's compute ops the cases build, from te.ops, and the te.pytorch modules Megatron subclasses.
COMPUTE_OPS = ("RMSNorm", "LayerNorm", "BasicLinear", "Bias", "GELU", "ReLU", "SwiGLU")
TE_MODULES = ("RMSNorm", "LayerNorm")
# The basic ops upstream's te.ops has held (2.1-2.20), by class name. A BasicOperation subclass of
# another name in a tree's te.ops is the fork's own: where one of ours is missing, it may be that op renamed.
UPSTREAM_BASIC_OPS = frozenset({
    "AddExtraInput", "AddInPlace", "AllGather", "AllReduce", "BasicLinear", "Bias", "ClampedSwiGLU", "ConstantScale",
    "Dropout", "GEGLU", "GELU", "GLU", "GroupedLinear", "Identity", "L2Normalization", "LayerNorm", "MakeExtraOutput",
    "QGEGLU", "QGELU", "Quantize", "ReGLU", "ReLU", "ReduceScatter", "Reshape", "RMSNorm", "SReGLU", "SReLU",
    "ScaledSwiGLU", "SiLU", "SwiGLU", "CastFloat8", "SiTUGLU", "ScaledClampedQGeGLU", "ScaledSReLU", "ScaledTanhSReLU",
    "ScaledSiTUGLU",
}) | frozenset(DATABASE_OPS)  # every op the database names is upstream's


@dataclass
class LoadedTarget:
    prepared: PreparedTarget
    ops: dict[str, Any]  # op name -> class; plus "Sequential" and "BasicOperation"
    te_ops: list[str]
    missing_ops: dict[str, str] = field(default_factory=dict)  # op name -> why it is absent
    te_dir: Path | None = None
    features: frozenset[str] = frozenset()  # op features of this release (see `op_features`)
    te_modules: dict[str, Any] = field(default_factory=dict)  # te.pytorch module classes (RMSNorm, LayerNorm)
    kernel_standins: list[str] = field(default_factory=list)  # extension functions with CPU stand-ins
    extension_names: int = 0  # names the target reads from the extension
    # Who computed the kernels: the harness's stand-ins, the tree's own Python module, or the native extension.
    kernels: str = ""
    unknown_ops: list[str] = field(default_factory=list)  # the tree's own BasicOperation subclasses (see UPSTREAM_BASIC_OPS)

    @property
    def description(self) -> str:
        te = ", ".join(self.te_ops)
        if self.prepared.backend == "native":
            return f"native TE: every op is TE's own ({te}); kernels: {self.kernels}"
        return (f"TE as shipped; kernels: {self.kernels}; TE's own: {te}; device: no FP8 (compute capability 8.0)")


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
    return innermost_te_frame(exc, te_dir) or ""


def _relative(filename: str, te_dir: Path) -> str:
    path = Path(filename).resolve()
    return str(path.relative_to(te_dir.resolve().parent)) if path.is_relative_to(te_dir.resolve().parent) else filename


def _torch_hint(module: str | None) -> str:
    """For a name torch lacks: which torch, so a tree written for another torch (an older fork that
    imports what torch has since removed) says so."""
    if module == "torch" or (module or "").startswith("torch."):
        return f" in torch {torch_version()}: the tree was written for another torch"
    return ""


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
                              f"the environment nor the CPU backend provides{_torch_hint(exc.name)}") from None
    except ImportError as exc:
        where = _importing_line(exc, te_dir) or name
        symbol = _missing_symbol(exc)
        module = exc.name or _module_imported_at(where, te_dir)
        if symbol and module:
            raise TargetLoadError(f"target {target}: {where} imports {symbol} from {module}, "
                                  f"which has no such name{_torch_hint(module)}") from None
        raise TargetLoadError(f"target {target}: {where} cannot import: {exc}") from None
    except Exception as exc:  # noqa: BLE001 — a SyntaxError or error at import time is the target's load error
        where = _importing_line(exc, te_dir) or name
        raise TargetLoadError(f"target {target}: importing {name} failed at {where}: "
                              f"{type(exc).__name__}: {exc}") from None


def _missing_symbol(exc: ImportError) -> str | None:
    match = re.match(r"cannot import name '([^']+)'", str(exc))
    return match.group(1) if match else None


def _module_imported_at(where: str, te_dir: Path) -> str | None:
    """The module a `from X import ...` statement at `file:line` names: a fork's own extension
    module may have no import name, so the ImportError cannot say which module lacked the name."""
    file, _, line = where.rpartition(":")
    try:
        source = (te_dir.parent / file).read_text(encoding="utf-8").splitlines()[int(line) - 1]
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    match = re.match(r"\s*from\s+([\w.]+)\s+import", source)
    return match.group(1) if match else None


def _forget_target() -> None:
    """Drop a half-loaded target, so the next attempt reports its own error again."""
    for name in [n for n in sys.modules if n == "transformer_engine" or n.startswith("transformer_engine.")]:
        del sys.modules[name]
    for name in [n for n in sys.modules if n.startswith(extension.EXTENSION)]:  # ours, and a fork's own
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, boundary.TargetFinder)]


def _fork_standins(prepared: PreparedTarget, te_dir: Path) -> None:
    """A fork config's `[standins]`: modules neither the target nor the environment has,
    answering only the named symbols. Real modules win: every module the target ships is
    imported as shipped, never stood in."""
    for module_name, symbols in prepared.extra_standins.items():
        shipped = module_name.startswith("transformer_engine.") and _ships(te_dir, module_name)
        if shipped or (not module_name.startswith("transformer_engine") and importlib.util.find_spec(
                module_name.split(".")[0]) is not None):
            raise TargetLoadError(f"target {prepared.spec}: fork config stands in {module_name}, but the "
                                  "target or the environment has the real module; remove it from [standins]")
        module = StrictModule(module_name, prepared.spec, {})
        module.__dict__.update({symbol: _standin_value(module_name, symbol, kind) for symbol, kind in symbols.items()})
        sys.modules[module_name] = module


def _ships(te_dir: Path, module_name: str) -> bool:
    """The tree has the module: a file the interpreter would import (source, bytecode or native)
    or a package directory."""
    path = te_dir.joinpath(*module_name.split(".")[1:])
    return path.is_dir() or any(path.with_name(path.name + suffix).is_file()
                                for suffix in importlib.machinery.all_suffixes())


def _standin_value(module_name: str, symbol: str, kind: str) -> Any:
    if kind == "class":
        return type(symbol, (), {"__module__": module_name})
    if kind == "noop":
        return lambda *_args, **_kwargs: None
    return {"none": None, "false": False, "true": True}[kind]


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


def load_cpu(prepared: PreparedTarget, answer_also: tuple[Path, ...] = ()) -> LoadedTarget:
    """`answer_also`: directories whose calls the device answers serve besides the target's files."""
    if any(name == "transformer_engine" or name.startswith("transformer_engine.") for name in sys.modules):
        raise TargetLoadError("a transformer_engine is already imported in this process; load one target per process")
    try:
        return _load_cpu(prepared, answer_also)
    except BaseException:
        _forget_target()
        raise


def _triton_stand_in(spec: str, te_dir: Path, name: str, module: str) -> Any:
    """What runs for one of TE's Triton kernels: its stand-in, else a MissingKernel naming it."""
    return triton_kernels.KERNELS.get(name) or extension.missing_kernel(spec, name, te_dir, module)


def _load_cpu(prepared: PreparedTarget, answer_also: tuple[Path, ...]) -> LoadedTarget:
    te_dir = Path(prepared.root or "") / "transformer_engine"
    device.install(te_dir, answer_also)
    module, stood_in = extension.build(prepared.spec, te_dir)
    sys.modules[module.__name__] = module
    sys.meta_path.insert(0, boundary.TargetFinder(te_dir, prepared.version, functools.partial(
        _triton_stand_in, prepared.spec, te_dir)))
    _fork_standins(prepared, te_dir)
    # transformer_engine/__init__.py swallows an ImportError of its pytorch package; importing
    # the package itself raises it again, with the target's file and line.
    te = _import(prepared.spec, "transformer_engine.pytorch", te_dir)
    te_ops_module = _import(prepared.spec, "transformer_engine.pytorch.ops", te_dir)
    device.answer_te_device_queries(sys.modules)
    op_module = _import(prepared.spec, "transformer_engine.pytorch.ops.op", te_dir)  # 2.1-2.3 do not export it
    ops: dict[str, Any] = {"Sequential": te_ops_module.Sequential, "BasicOperation": op_module.BasicOperation}
    te_ops, missing = [], {}
    for op_name, module_names in TE_OPS.items():
        found = _find_op(prepared, te_dir, op_name, module_names)
        if found is None:
            missing[op_name] = f"{prepared.spec} has no ops/basic/{module_names[0]}.py"
            continue
        ops[op_name] = found
        te_ops.append(op_name if found.__name__ == op_name else f"{op_name} (as {found.__name__})")
    for name in COMPUTE_OPS:
        if hasattr(te_ops_module, name):
            ops[name] = getattr(te_ops_module, name)
            te_ops.append(name)
        else:
            missing[name] = f"{prepared.spec}'s te.ops has no {name}"
    _add_database_ops(prepared.spec, te_ops_module, ops, missing)
    modules = {name: getattr(te, name) for name in TE_MODULES if hasattr(te, name)}
    return LoadedTarget(prepared, ops, te_ops, missing, te_dir, op_features(ops), te_modules=modules,
                        kernel_standins=[f"{module.__name__}.{k}" for k in stood_in],
                        extension_names=len(extension.extension_names(te_dir)),
                        kernels=kernel_provider(module, len(stood_in), len(extension.extension_names(te_dir))),
                        unknown_ops=own_basic_ops(te_ops_module, op_module.BasicOperation))


def _add_database_ops(spec: str, te_ops_module: Any, ops: dict[str, Any], missing: dict[str, str]) -> None:
    """The op database's ops te.ops holds, beside the catalogue's (kept out of `te_ops`, which a
    target's description lists); each one it lacks, with why."""
    for name in DATABASE_OPS:
        if name in ops or name in missing:
            continue
        if hasattr(te_ops_module, name):
            ops[name] = getattr(te_ops_module, name)
        else:
            missing[name] = f"{spec}'s te.ops has no {name}"


def kernel_provider(standin: types.ModuleType, standins: int, names: int) -> str:
    """Which code computes the kernels TE calls through `transformer_engine_torch`: the harness's
    stand-ins, or the tree's own Python module registered under that name (a fork's dispatcher)."""
    front = sys.modules.get("transformer_engine_torch")
    if front is None or front is standin:
        return f"the harness's CPU stand-ins ({standins} kernels, of {names} names the target reads)"
    # A module object of a class of its own (a dispatcher) has no __file__: its class's module has.
    where = getattr(front, "__file__", None) or getattr(sys.modules.get(type(front).__module__), "__file__", None) \
        or type(front).__name__
    return (f"the tree's own Python module transformer_engine_torch ({where}); the harness stands in only"
            f" {standin.__name__}")


def own_basic_ops(te_ops_module: Any, base: type) -> list[str]:
    """The BasicOperation subclasses `te.ops` exports under a name upstream never used, as
    "module:Class" (module: its file in ops/basic/), the form `[renamed_ops]` takes."""
    found = {}
    for namespace in (te_ops_module, getattr(te_ops_module, "basic", None)):
        for name, value in vars(namespace or object).items():
            if (isinstance(value, type) and issubclass(value, base) and value is not base and not name.startswith("_")
                    and name not in UPSTREAM_BASIC_OPS):
                found[name] = f"{value.__module__.rpartition('.')[2]}:{name}"
    return sorted(found.values())


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
    _add_database_ops(prepared.spec, te.ops, ops, missing)
    te_dir = Path(te.__file__ or "").resolve().parent.parent
    return LoadedTarget(prepared, ops, [n for n in names if n in ops], missing, te_dir, op_features(ops),
                        kernels="the native extension", unknown_ops=own_basic_ops(te.ops, te.ops.BasicOperation))


_LOADED: LoadedTarget | None = None


def loaded() -> LoadedTarget | None:
    """The target this process loaded (Megatron is imported on top of it)."""
    return _LOADED


def load(prepared: PreparedTarget, answer_also: tuple[Path, ...] = ()) -> LoadedTarget:
    global _LOADED
    # Never write bytecode into a source under test (path: trees, the installed TE), even
    # where PYTHONDONTWRITEBYTECODE is unset.
    sys.dont_write_bytecode = True
    if prepared.patch_status == "conflict":
        raise TargetLoadError(f"target {prepared.spec}: patch {prepared.patch} does not apply (conflict)")
    _LOADED = load_native(prepared) if prepared.backend == "native" else load_cpu(prepared, answer_also)
    return _LOADED
