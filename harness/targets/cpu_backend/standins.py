"""Stand-in modules for the parts of TE that load `transformer_engine_torch` or need CUDA.

Each stand-in is a `StrictModule`: it answers only the names listed here. Any other
name raises `FidelityError` naming the target, the module and the symbol, so a target
that needs something we do not provide fails at load time with one clear message
instead of an AttributeError deep inside a case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from harness.errors import FidelityError
from harness.targets.cpu_backend import kernels


class StrictModule(types.ModuleType):
    """A module that refuses names it was not given, with a `FidelityError`.

    Dunder look-ups (`__file__`, `__path__`, ...) get a plain AttributeError:
    `inspect`, and through it `torch.utils.checkpoint`, probe them on every module.
    """

    def __init__(self, name: str, target: str, symbols: dict[str, Any], prefixes: dict[str, Any]):
        super().__init__(name)
        self.__dict__.update(symbols)
        self.__dict__["_standin_target"] = target
        self.__dict__["_standin_prefixes"] = prefixes

    # Set while a client that probes optional names (Megatron) is imported: it gets the
    # error to raise instead, one that also reads as "absent" to hasattr and try/except ImportError.
    probe_hook: Callable[[str, str, str], Exception] | None = None

    def __getattr__(self, symbol: str) -> Any:
        if symbol.startswith("__") and symbol.endswith("__"):
            raise AttributeError(symbol)
        for prefix, factory in self._standin_prefixes.items():
            if symbol.startswith(prefix):
                return factory(symbol)
        if StrictModule.probe_hook is not None:
            raise StrictModule.probe_hook(self._standin_target, self.__name__, symbol)
        raise FidelityError(self._standin_target, self.__name__, symbol)


class _StrictClassMeta(type):
    """Class attributes the stand-in does not define raise `FidelityError` too."""

    _standin_target = "?"

    def __getattr__(cls, symbol: str) -> Any:
        if symbol.startswith("__") and symbol.endswith("__"):
            raise AttributeError(symbol)
        raise FidelityError(cls._standin_target, f"{cls.__module__}.{cls.__name__}", symbol)


def _make_fp8_global_state_manager(target: str, module: str) -> type:
    """FP8 is disabled on the CPU backend: every query answers 'not enabled'."""

    def no(*_args: Any, **_kwargs: Any) -> bool:
        return False

    def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    namespace = {
        "__module__": module,
        "is_fp8_enabled": staticmethod(no),
        "is_fp8_calibration": staticmethod(no),
        "with_fp8_parameters": staticmethod(no),
        "fp8_graph_capturing": staticmethod(no),
        "is_first_fp8_module": staticmethod(no),
        "get_fp8_recipe": staticmethod(nothing),
        "get_fp8_group": staticmethod(nothing),
        "reduce_and_update_fp8_tensors": staticmethod(nothing),
    }
    meta = type("_Meta", (_StrictClassMeta,), {"_standin_target": target})
    return meta("FP8GlobalStateManager", (), namespace)


class Quantizer:
    """Type stand-in: no quantizer is ever built while FP8 is disabled."""


class QuantizedTensorStorage:
    """Type stand-in: the CPU backend only ever saves plain tensors."""


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """Type stand-in for 2.20's experimental quantizer role."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""


class RecipeState:
    """Only built for FP8 recipes, which the CPU backend refuses."""

    @staticmethod
    def create(*_args: Any, **_kwargs: Any) -> None:
        raise NotImplementedError("FP8 recipes are not available on the CPU backend")


# Releases before 2.7 import these from fp8 for isinstance checks that only run
# with FP8 enabled; distinct subclasses keep those checks meaningful.
class DelayedScalingRecipeState(RecipeState):
    """Type stand-in."""


class MXFP8BlockScalingRecipeState(RecipeState):
    """Type stand-in."""


class Float8BlockScalingRecipeState(RecipeState):
    """Type stand-in."""


@contextlib.contextmanager
def autocast(enabled: bool = False, **_kwargs: Any) -> Iterator[None]:
    """Quantized autocast; only the disabled form is meaningful on the CPU."""
    if enabled:
        raise NotImplementedError("FP8 autocast is not available on the CPU backend")
    yield


def prepare_for_saving(*tensors: Any) -> tuple[list[Any], list[None]]:
    """Plain tensors are saved as they are, with no tensor object beside them."""
    for tensor in tensors:
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise NotImplementedError(f"cannot save {type(tensor).__name__} on the CPU backend")
    return list(tensors), [None] * len(tensors)


def restore_from_saved(tensor_objects: list[Any], saved_tensors: Any, return_saved_tensors: bool = False) -> Any:
    restored = list(saved_tensors)[: len(tensor_objects)]
    if return_saved_tensors:
        return restored, list(saved_tensors)[len(tensor_objects) :]
    return restored


def restore_from_func_ctx(ctx: Any, return_saved_tensors: bool = False) -> Any:
    out = restore_from_saved(ctx.tensor_objects, ctx.saved_tensors, return_saved_tensors)
    ctx.tensor_objects = None
    return out


def is_graph_capturing() -> bool:
    return False


def is_cpu_offload_enabled() -> bool:
    """Activation offload to host memory is off: the activations already live there."""
    return False


def mark_activation_offload(*_tensors: Any) -> None:
    raise NotImplementedError("CPU activation offload is not available on the CPU backend")


def decode_cudnn_version(_encoded_version: int) -> tuple[int, int, int]:
    """2.20's utils.py imports this from the package root; only cuDNN queries call it."""
    raise NotImplementedError("cuDNN is not available on the CPU backend")


def _no_onnx(name: str) -> Callable[..., Any]:
    """export.py imports ONNX translations (which need onnxscript) at module level; they
    run only inside `onnx_export(enabled=True)`, which the CPU backend never enters."""

    def translation(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"ONNX export ({name}) is not available on the CPU backend")

    translation.__name__ = name
    return translation


class DebugQuantizedTensor:
    """Type stand-in: utils.py only isinstance-checks against it; debug mode is off."""


class Float8Tensor(QuantizedTensorStorage):
    """Type stand-in: ops/_common.py isinstance-checks against it; FP8 is off."""


# 2.20's ops/_common.py isinstance-checks a quantizer against these; none is ever built.
QUANTIZER_TYPES = {
    name: type(name, (Quantizer,), {"__doc__": "Type stand-in."})
    for name in ("Float8Quantizer", "Float8CurrentScalingQuantizer", "Float8BlockQuantizer", "MXFP8Quantizer",
                 "NVFP4Quantizer")
}


def _no_fusion(name: str) -> Callable[..., Any]:
    """Releases up to 2.12 import `fuse_*` passes from ops/fused, which imports the
    compiled extension. They only rewrite TE's kernel ops (BasicLinear, ...), which
    never appear in a CPU-backend pipeline, so the stand-in leaves the op list as is."""

    def fuse(ops: list[Any], *_args: Any, **_kwargs: Any) -> list[Any]:
        return ops

    fuse.__name__ = name
    return fuse


def _present(te_dir: Path, name: str) -> bool:
    """Whether the target ships module `name` (as a file or a package)."""
    path = te_dir.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def standin_modules(target: str, recipe_module: types.ModuleType, te_dir: Path | None = None) -> dict[str, StrictModule]:
    """Build the stand-ins for one target. `recipe_module` is the target's own
    `transformer_engine.common.recipe`, loaded from its source.

    With `te_dir` (the target's transformer_engine/ directory), only modules the
    target actually ships are stood in, so a release that lacks a module fails to
    import it just as the real release would; and from 2.9, where fp8.py is a
    pure-Python re-export shim over quantization.py, fp8 loads real from the source.
    """
    recipe_names = {name: getattr(recipe_module, name) for name in dir(recipe_module) if not name.startswith("_")}

    def module(name: str, symbols: dict[str, Any], prefixes: dict[str, Any] | None = None) -> StrictModule:
        return StrictModule(name, target, symbols, prefixes or {})

    def quantization(name: str) -> StrictModule:
        symbols: dict[str, Any] = {
            "FP8GlobalStateManager": _make_fp8_global_state_manager(target, name),
            "RecipeState": RecipeState,
            "autocast": autocast,
            "fp8_autocast": autocast,
            "QuantizerRole": QuantizerRole,
            "DelayedScalingRecipeState": DelayedScalingRecipeState,
            "MXFP8BlockScalingRecipeState": MXFP8BlockScalingRecipeState,
            "Float8BlockScalingRecipeState": Float8BlockScalingRecipeState,
        }
        symbols.update(recipe_names)  # TE re-exports the recipe classes from here
        return module(name, symbols)

    quantized_tensor_symbols = {
        "prepare_for_saving": prepare_for_saving,
        "restore_from_saved": restore_from_saved,
        "restore_from_func_ctx": restore_from_func_ctx,
        "QuantizedTensorStorage": QuantizedTensorStorage,
        "QuantizedTensorBase": QuantizedTensorStorage,
        "Quantizer": Quantizer,
    }
    modules = {
        # The extension: only the norm kernels and the enums their callers read.
        "transformer_engine_torch": module("transformer_engine_torch", {**kernels.KERNELS, **kernels.ENUMS}),
        "transformer_engine.pytorch.quantization": quantization("transformer_engine.pytorch.quantization"),
        "transformer_engine.pytorch.fp8": quantization("transformer_engine.pytorch.fp8"),
        "transformer_engine.pytorch.tensor": module(
            "transformer_engine.pytorch.tensor",
            {"Quantizer": Quantizer, "QuantizedTensorStorage": QuantizedTensorStorage, **QUANTIZER_TYPES},
        ),
        "transformer_engine.pytorch.tensor.float8_tensor": module(
            "transformer_engine.pytorch.tensor.float8_tensor", {"Float8Tensor": Float8Tensor}
        ),
        "transformer_engine.pytorch.cpu_offload": module(
            "transformer_engine.pytorch.cpu_offload",
            {"is_cpu_offload_enabled": is_cpu_offload_enabled, "mark_activation_offload": mark_activation_offload},
        ),
        "transformer_engine.pytorch.onnx_extensions": module(
            "transformer_engine.pytorch.onnx_extensions", {"te_translation_table": {}},
            {"onnx_": _no_onnx, "torch_onnx_": _no_onnx},
        ),
        "transformer_engine.debug.pytorch.debug_quantization": module(
            "transformer_engine.debug.pytorch.debug_quantization", {"DebugQuantizedTensor": DebugQuantizedTensor}
        ),
        "transformer_engine.pytorch.quantized_tensor": module(
            "transformer_engine.pytorch.quantized_tensor", quantized_tensor_symbols
        ),
        "transformer_engine.pytorch.tensor.quantized_tensor": module(
            "transformer_engine.pytorch.tensor.quantized_tensor", quantized_tensor_symbols
        ),
        "transformer_engine.pytorch.graph": module(
            "transformer_engine.pytorch.graph", {"is_graph_capturing": is_graph_capturing}
        ),
        "transformer_engine.pytorch.ops.fused": module(
            "transformer_engine.pytorch.ops.fused", {}, {"fuse_": _no_fusion}
        ),
    }
    if te_dir is not None:
        if _present(te_dir, "transformer_engine.pytorch.quantization"):
            del modules["transformer_engine.pytorch.fp8"]
        modules = {
            name: standin for name, standin in modules.items()
            if name == "transformer_engine_torch" or _present(te_dir, name)
        }
    # `from ..tensor import quantized_tensor` must find the submodule as an attribute.
    for child in ("quantized_tensor", "float8_tensor"):
        if f"transformer_engine.pytorch.tensor.{child}" in modules and "transformer_engine.pytorch.tensor" in modules:
            modules["transformer_engine.pytorch.tensor"].__dict__[child] = modules[
                f"transformer_engine.pytorch.tensor.{child}"
            ]
    return modules
