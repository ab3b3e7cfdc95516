"""Import a prepared target into the current process.

On the CPU backend the package `__init__`s (which load the compiled library) are
bypassed: empty package shells point at the target's own directories, so every real
module (fuser.py, op.py, sequential.py, the pass-through ops, common/recipe) is
imported from the target's files exactly as shipped. The stand-ins from
`cpu_backend.standins` fill the few modules that need the extension.

One process holds one target: two TE versions cannot share an interpreter.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import FidelityError, TargetLoadError
from harness.targets import PreparedTarget
from harness.targets.cpu_backend.ops import make_cpu_ops
from harness.targets.cpu_backend.standins import standin_modules

PACKAGE_SHELLS = (
    "transformer_engine",
    "transformer_engine.common",
    "transformer_engine.pytorch",
    "transformer_engine.pytorch.ops",
    "transformer_engine.pytorch.ops.basic",
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


@dataclass
class LoadedTarget:
    prepared: PreparedTarget
    ops: dict[str, Any]  # op name -> class; plus "Sequential" and "BasicOperation"
    te_ops: list[str]
    backend_ops: list[str]
    missing_ops: dict[str, str] = field(default_factory=dict)  # op name -> why it is absent
    te_dir: Path | None = None
    features: frozenset[str] = frozenset()  # op features of this release (see `op_features`)

    @property
    def description(self) -> str:
        te = ", ".join(self.te_ops)
        if self.prepared.backend == "native":
            return f"native TE: every op is TE's own ({te})"
        return f"TE's own: {te}; CPU backend: {', '.join(self.backend_ops)}"


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


def _import(target: str, name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except FidelityError:
        raise
    except ModuleNotFoundError as exc:
        raise TargetLoadError(
            f"target {target}: module {name} imports {exc.name}, which neither the target nor the CPU backend provides"
        ) from None
    except ImportError as exc:
        raise TargetLoadError(f"target {target}: importing {name} failed: {exc}") from None


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
    te_dir = Path(prepared.root or "") / "transformer_engine"
    for name in PACKAGE_SHELLS:
        _install(name, _shell(name, te_dir.joinpath(*name.split(".")[1:])))
    recipe = _import(prepared.spec, "transformer_engine.common.recipe")
    for name, module in standin_modules(prepared.spec, recipe, te_dir).items():
        _install(name, module)
    op_module = _import(prepared.spec, "transformer_engine.pytorch.ops.op")
    _import(prepared.spec, "transformer_engine.pytorch.ops.fuser")
    sequential = _import(prepared.spec, "transformer_engine.pytorch.ops.sequential")

    ops: dict[str, Any] = {"Sequential": sequential.Sequential, "BasicOperation": op_module.BasicOperation}
    te_ops, missing = [], {}
    for op_name, module_names in TE_OPS.items():
        for module_name in module_names:
            if (te_dir / "pytorch/ops/basic" / f"{module_name}.py").is_file():
                basic = _import(prepared.spec, f"transformer_engine.pytorch.ops.basic.{module_name}")
                ops[op_name] = getattr(basic, op_name, None) or getattr(basic, OLD_NAMES.get(op_name, op_name))
                te_ops.append(op_name if ops[op_name].__name__ == op_name else f"{op_name} (as {ops[op_name].__name__})")
                break
        else:
            missing[op_name] = f"{prepared.spec} has no ops/basic/{module_names[0]}.py"
    backend = make_cpu_ops(op_module.BasicOperation)
    ops.update(backend)
    return LoadedTarget(prepared, ops, te_ops, list(backend), missing, te_dir, op_features(ops))


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


def load(prepared: PreparedTarget) -> LoadedTarget:
    if prepared.patch_status == "conflict":
        raise TargetLoadError(f"target {prepared.spec}: patch {prepared.patch} does not apply (conflict)")
    return load_native(prepared) if prepared.backend == "native" else load_cpu(prepared)
