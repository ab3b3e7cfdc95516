"""Import a prepared Megatron into a process that already holds a loaded TE target.

Order matters: Megatron decides at import time whether TE is there and whether
`TEFusedResidualRMSNorm` exists (`is_te_min_version("1.13.0")`), so the TE target is
loaded first (the whole package as shipped, `te_surface` checks what Megatron reads at import),
then Megatron's own modules from the prepared source, then the CPU redirects (`cpu_redirects`).
One Megatron per process.

Nothing is written into the source: bytecode writing is off for the whole process
(`sys.dont_write_bytecode`) before the first Megatron module is imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.errors import FidelityError, TargetLoadError
from harness.megatron import cpu_redirects, te_surface
from harness.megatron.source import DEFAULT_VERSION, MEGATRON_ENV, PreparedMegatron, prepare_megatron
from harness.targets.cpu_backend.strict import StrictModule
from harness.targets.loader import LoadedTarget, _install, _shell

# The Megatron modules the clients and the `megatron` recompute wrapper use.
MODULES = (
    "megatron.core",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.extensions.transformer_engine_spec_provider",
    "megatron.core.tensor_parallel.random",
    "megatron.core.parallel_state",
    "megatron.core.transformer.transformer_config",
    "megatron.core.transformer.transformer_block",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.models.gpt.gpt_layer_specs",
)
# Megatron's Triton kernels, imported unguarded by `import megatron.core` (0.19: MoE paged
# stash). Stood in only where triton is not installed, and then refuses to run.
TRITON_KERNEL_MODULES = ("megatron.core.transformer.moe.ops.paged_stash",)


@dataclass
class LoadedMegatron:
    prepared: PreparedMegatron
    target_spec: str
    modules: dict[str, ModuleType]
    import_s: float
    redirects: list[str]
    stood_in: list[str]
    notes: list[str] = field(default_factory=list)

    def module(self, short: str) -> Any:
        """`module("transformer.transformer_block")` -> megatron.core.transformer.transformer_block."""
        return self.modules[f"megatron.core.{short}" if short else "megatron.core"]

    @property
    def has_fused_residual_rmsnorm(self) -> bool:
        return getattr(self.module("extensions.transformer_engine"), "TEFusedResidualRMSNorm", None) is not None

    @property
    def description(self) -> str:
        parts = [f"megatron-core {self.prepared.version} ({self.prepared.source}) on {self.target_spec}",
                 "TEFusedResidualRMSNorm " + ("defined" if self.has_fused_residual_rmsnorm else "NOT defined"),
                 f"Megatron modules stood in: {', '.join(self.stood_in) or 'none'}",
                 f"CPU redirects: {'; '.join(self.redirects) or 'none'}"]
        return " | ".join(parts + self.notes)


_LOADED: LoadedMegatron | None = None


def loaded() -> LoadedMegatron | None:
    return _LOADED


def _kernel_standin(name: str, root: Path, target_spec: str) -> StrictModule | None:
    """Module constants read from the file itself; kernels that refuse to launch."""
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    symbols: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                symbols[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
        elif isinstance(node, ast.FunctionDef):
            symbols[node.name] = _refuse_kernel(f"{name}.{node.name}")
    return StrictModule(name, target_spec, symbols)


def _refuse_kernel(qualname: str) -> Any:
    def kernel(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"{qualname} is a Triton kernel; Triton is not installed (CPU)")

    return kernel


def load_megatron(prepared: PreparedMegatron, target: LoadedTarget, device: str = "cpu") -> LoadedMegatron:
    """Import Megatron after `target` (idempotent for the same source)."""
    global _LOADED
    if _LOADED is not None:
        if _LOADED.prepared.root != prepared.root:
            raise TargetLoadError(f"megatron-core from {_LOADED.prepared.root} is already loaded; one per process")
        return _LOADED
    if "megatron" in sys.modules:
        raise TargetLoadError("a megatron package was imported before the harness loaded one; load one per process")
    sys.dont_write_bytecode = True  # never write into the source under test
    started = time.perf_counter()
    root = Path(prepared.root)
    te_modules = te_surface.install(target) if target.prepared.backend == "cpu" else []
    # Only this source's megatron/, never an installed megatron-core's.
    _install("megatron", _shell("megatron", root / "megatron"))
    stood_in = []
    for name in TRITON_KERNEL_MODULES if importlib.util.find_spec("triton") is None else ():
        if (standin := _kernel_standin(name, root, target.prepared.spec)) is not None:
            sys.modules[name] = standin
            stood_in.append(f"{name} (Triton kernels)")
    modules = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TE and Apex are not installed ..." at import
        for name in MODULES:
            try:
                modules[name] = importlib.import_module(name)
            except (ImportError, FidelityError) as exc:
                raise TargetLoadError(f"megatron-core {prepared.version}: importing {name} failed: "
                                      f"{type(exc).__name__}: {exc}") from None
    redirects = cpu_redirects.apply(device)
    _LOADED = LoadedMegatron(prepared, target.prepared.spec, modules, round(time.perf_counter() - started, 3),
                             redirects, stood_in,
                             [f"TE as shipped under Megatron: {len(te_modules)} transformer_engine.pytorch modules"]
                             if te_modules else [])
    return _LOADED


def prepared_for_process(cache: Path | None = None) -> PreparedMegatron:
    """The Megatron a worker was handed ($TE_REPRO_MEGATRON), else the default release."""
    if os.environ.get(MEGATRON_ENV):
        return PreparedMegatron.from_json(os.environ[MEGATRON_ENV])
    from harness.targets.sources import cache_dir

    return prepare_megatron(DEFAULT_VERSION, cache or cache_dir())
