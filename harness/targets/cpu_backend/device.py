"""The device TE asks about, on a machine without a GPU: the only place it is answered.

TE's Python code asks torch about the CUDA device at call time, not only at import:
`is_fp8_available()` and the GEMM workspace size read the compute capability through
`torch.cuda.get_device_properties(torch.cuda.current_device())`, and upstream's test
utilities save and restore `torch.cuda.get_rng_state()`. CPU torch raises on each. On the CPU
backend they answer as one device **without FP8**: compute capability 8.0 (FP8 needs 8.9, so
TE itself reports FP8, MXFP8 and NVFP4 unavailable and skips their paths), and a CUDA
generator of its own, seeded like torch's CPU generator. `torch.cuda.is_available()` still
says False, and anything else under torch.cuda fails as CPU torch makes it fail.

Every answer applies only to calls made from the target's own files (and from the directories
`install` is given besides: the checkout's tests that `repro upstream-tests` runs, whose
helpers save the CUDA generator's state). Called from anywhere else, torch.cuda is torch's
own: `torch.compile`'s inductor, which reads more device properties than TE does, sees a host
without CUDA, as it is. Installed by the loader (`install`), before the target is imported.

Where TE's own code names CUDA outright, the CUDA device is the CPU, the device the CPU
backend computes on:
- `tensor.cuda()` called from the target's own files (releases up to 2.5 move an activation's
  input with `x.cuda()`; `utils._empty_tensor()` is `torch.Tensor().cuda()`) returns the tensor
  as it is, and `torch.empty/zeros/ones/full(..., device="cuda")` called from them allocate on
  the CPU (the cuBLAS workspace up to 2.12; 2.6's FP8 recipe state, which its fused
  linear+bias op builds even with FP8 off), and `torch.cuda.Stream()` called from them is
  torch's CPU stream, `torch.cpu.Stream()`, which does nothing (2.5-2.9's CPU-offload handler
  makes two streams even with offloading off, and Megatron's TransformerBlock builds that
  handler), and `torch.cuda.synchronize()` called from them returns at once, as the CPU's
  work is done when a call returns (2.5-2.8's `BasicOperation.get_extra_state`, which every
  `state_dict()` of a TE op runs), and CUDA's autocast state read from them
  (`torch.is_autocast_enabled()`, `torch.get_autocast_dtype("cuda")`,
  `torch.get_autocast_gpu_dtype()`: TE's linear, activation and dropout ops pick their compute
  dtype by it) is the CPU's, the autocast a caller on the CPU backend enters. Called from
  anywhere else, they are torch's own;

and, after import (`answer_te_device_queries`), one of TE's helpers:
- `canonicalize_device(None)`, "the default CUDA device", which releases up to 2.12 move an
  op's CPU tensors to (`if device.type != "cuda": device = canonicalize_device(None)`), is the
  CPU: the device the CPU backend computes on. Given a device, it is TE's own;
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from harness.targets.refusal import REFUSE_ENV

CAPABILITY = (8, 0)
NAME = "CPU backend (no FP8): compute capability 8.0"
_generator = torch.Generator()

PROPERTIES = types.SimpleNamespace(
    name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], multi_processor_count=1,
    total_memory=0, is_integrated=False, is_multi_gpu_board=False,
)


def current_device() -> int:
    return 0


def get_device_properties(_device: Any = None) -> types.SimpleNamespace:
    return PROPERTIES


def get_device_capability(_device: Any = None) -> tuple[int, int]:
    return CAPABILITY


def get_device_name(_device: Any = None) -> str:
    return NAME


def get_rng_state(_device: Any = "cuda") -> torch.Tensor:
    return _generator.get_state()


def set_rng_state(state: torch.Tensor, _device: Any = "cuda") -> None:
    _generator.set_state(state)


def manual_seed(seed: int) -> None:
    _generator.manual_seed(seed)


def cuda_generator() -> torch.Generator:
    """The CUDA generator the answers above stand in: TE's kernels that draw random bits
    (dropout) draw from it, as the extension draws from torch's default CUDA generator."""
    return _generator


ANSWERS = {f.__name__: f for f in (current_device, get_device_properties, get_device_capability,
                                   get_device_name, get_rng_state, set_rng_state, manual_seed)}


def _on_cpu(device_type: Any) -> Any:
    return "cpu" if device_type == "cuda" else device_type


def is_autocast_enabled(device_type: Any = "cuda") -> bool:
    return _ORIGINAL_AUTOCAST["is_autocast_enabled"](_on_cpu(device_type))


def get_autocast_dtype(device_type: Any) -> torch.dtype:
    return _ORIGINAL_AUTOCAST["get_autocast_dtype"](_on_cpu(device_type))


def get_autocast_gpu_dtype() -> torch.dtype:
    return _ORIGINAL_AUTOCAST["get_autocast_dtype"]("cpu")


# torch's own, kept before `install` answers them (the answers call these with the CPU).
_ORIGINAL_AUTOCAST = {name: getattr(torch, name) for name in ("is_autocast_enabled", "get_autocast_dtype")}
AUTOCAST_ANSWERS = {f.__name__: f for f in (is_autocast_enabled, get_autocast_dtype, get_autocast_gpu_dtype)}


def _cpu_by_default(canonicalize: Any) -> Any:
    @functools.wraps(canonicalize)
    def canonicalize_device(device: Any = None) -> torch.device:
        if device is None:
            _note("canonicalize_device(None)")
            return torch.device("cpu")
        return canonicalize(device)

    return canonicalize_device


def answer_te_device_queries(modules: dict[str, types.ModuleType]) -> list[str]:
    """The helpers above, where TE defines them and in every loaded TE module that imported
    them by name; once, right after the target's import."""
    if torch.cuda.is_available():
        return []
    replacements: dict[str, tuple[Any, Any]] = {}
    for module_name, name, make in (("utils", "canonicalize_device", _cpu_by_default),):
        home = modules.get(f"transformer_engine.pytorch.{module_name}")
        original = getattr(home, name, None)
        if original is not None:
            replacements[name] = (original, make(original))
    answered = []
    for module_name, module in list(modules.items()):
        if not module_name.startswith("transformer_engine."):
            continue
        for name, (original, replacement) in replacements.items():
            if module.__dict__.get(name) is original:
                setattr(module, name, replacement)
                answered.append(f"{module_name}.{name}")
    return answered


# The answered calls of the case being observed, when one is (`answered_calls`).
_answered: set[str] | None = None
# What `REFUSE_ENV` refuses: the CUDA calls, not the autocast state queries.
REFUSED_CALLS = ("torch.cuda.", "Tensor.cuda()", "device='cuda'", "canonicalize_device(None)")


class DeviceCallRefused(RuntimeError):
    """A CUDA call from the target's files during a case, refused (REFUSE_ENV)."""


@contextlib.contextmanager
def answered_calls() -> Iterator[set[str]]:
    """Collects each call the CPU backend answers for the target's files while it is open, as
    `torch.cuda.synchronize() at transformer_engine/pytorch/ops/op.py:123`: what a port of TE
    to another device must replace, and what could hide a bug on a host without CUDA."""
    global _answered
    outer, _answered = _answered, set()
    try:
        yield _answered
    finally:
        _answered = outer


def _note(call: str) -> None:
    """Record the answered `call` with the file and line that made it (the caller of the answer)."""
    if _answered is not None:
        frame = sys._getframe(2)
        where = frame.f_code.co_filename
        marker = where.rfind(os.sep + "transformer_engine" + os.sep)
        seen = f"{call} at {where[marker + 1:] if marker >= 0 else Path(where).name}:{frame.f_lineno}"
        _answered.add(seen)
        if os.environ.get(REFUSE_ENV) == "1" and any(kind in call for kind in REFUSED_CALLS):
            raise DeviceCallRefused(f"{seen}: refused, as a host without CUDA would (--refuse-device-calls)")


def _called_from(te_dir: str | tuple[str, ...]) -> bool:
    """Whether the caller of the function calling this is one of the target's own files
    (or under one of the directories given)."""
    dirs = (te_dir,) if isinstance(te_dir, str) else te_dir
    return sys._getframe(2).f_code.co_filename.startswith(tuple(d + os.sep for d in dirs))


def _answer_from(dirs: tuple[str, ...], answer: Any, original: Any) -> Any:
    """`answer` for calls from `dirs`, torch's `original` for everyone else."""
    @functools.wraps(answer)
    def answered(*args: Any, **kwargs: Any) -> Any:
        if _called_from(dirs):
            _note(f"{original.__module__}.{original.__name__}()")
            return answer(*args, **kwargs)
        return original(*args, **kwargs)

    answered.answered_by_cpu_backend = True  # type: ignore[attr-defined]
    return answered


def _cuda_from_te(te_dir: str, original: Any) -> Any:
    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _called_from(te_dir):
            _note("Tensor.cuda()")
            return self
        return original(self, *args, **kwargs)

    cuda.answered_by_cpu_backend = True  # type: ignore[attr-defined]
    return cuda


FACTORIES = ("empty", "zeros", "ones", "full")


def _is_cuda(device: Any) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


def _factory_from_te(te_dir: str, original: Any) -> Any:
    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _is_cuda(kwargs.get("device")) and _called_from(te_dir):
            _note(f"torch.{original.__name__}(device='cuda')")
            kwargs["device"] = "cpu"
        return original(*args, **kwargs)

    factory.answered_by_cpu_backend = True  # type: ignore[attr-defined]
    return factory


def _stream_from_te(te_dir: str, original: type) -> type:
    class Stream(original):  # type: ignore[misc, valid-type]  # still a type: isinstance and annotations work
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if _called_from(te_dir):
                _note("torch.cuda.Stream()")
                return torch.cpu.Stream()
            return super().__new__(cls, *args, **kwargs)

    Stream.__module__, Stream.__qualname__ = original.__module__, original.__qualname__
    Stream.answered_by_cpu_backend = True  # type: ignore[attr-defined]
    return Stream


def _synchronize_from_te(te_dir: str, original: Any) -> Any:
    @functools.wraps(original)
    def synchronize(*args: Any, **kwargs: Any) -> None:
        if not _called_from(te_dir):
            original(*args, **kwargs)
        else:
            _note("torch.cuda.synchronize()")

    synchronize.answered_by_cpu_backend = True  # type: ignore[attr-defined]
    return synchronize


def install(te_dir: Path, also: tuple[Path, ...] = ()) -> list[str]:
    """Answer the queries above in torch.cuda, and TE's own `tensor.cuda()` (once per process),
    for calls from `te_dir` and the directories in `also`; returns what is answered. A CUDA
    build of torch with a device keeps its own answers."""
    if torch.cuda.is_available():
        return []
    if not getattr(torch.cuda.current_device, "answered_by_cpu_backend", False):
        dirs = tuple(str(d) for d in (te_dir, *also))
        for name, cuda_answer in ANSWERS.items():
            setattr(torch.cuda, name, _answer_from(dirs, cuda_answer, getattr(torch.cuda, name)))
        for name, autocast_answer in AUTOCAST_ANSWERS.items():
            setattr(torch, name, _answer_from(dirs, autocast_answer, getattr(torch, name)))
    if not getattr(torch.Tensor.cuda, "answered_by_cpu_backend", False):
        torch.Tensor.cuda = _cuda_from_te(str(te_dir), torch.Tensor.cuda)  # type: ignore[method-assign]
        for name in FACTORIES:
            setattr(torch, name, _factory_from_te(str(te_dir), getattr(torch, name)))
        torch.cuda.Stream = _stream_from_te(str(te_dir), torch.cuda.Stream)  # type: ignore[misc, assignment]
        torch.cuda.synchronize = _synchronize_from_te(str(te_dir), torch.cuda.synchronize)
    return ([f"torch.cuda.{name} from the target's files" for name in ANSWERS]
            + [f"torch.{name} (CUDA's autocast is the CPU's) from the target's files" for name in AUTOCAST_ANSWERS]
            + [f"torch.{name}(device='cuda') and torch.Tensor.cuda from the target's files" for name in FACTORIES]
            + ["torch.cuda.Stream() and torch.cuda.synchronize() from the target's files"])
