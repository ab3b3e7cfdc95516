"""What a loaded target's `te.ops` holds, read off TE's own classes: run as
`python -m harness.targets.inventory` in a `repro exec` process (the target already loaded),
it prints one JSON object: the basic ops (BasicOperation subclasses that te.ops or
te.ops.basic export) and the fused ops (FusedOperation subclasses in te.ops.fused), by name."""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any


def subclasses_in(modules: list[Any], base: type) -> list[str]:
    """Public classes of `modules` that subclass `base` (not `base` itself), sorted, once each."""
    found = {name for module in modules for name, value in vars(module).items()
             if inspect.isclass(value) and issubclass(value, base) and value is not base and not name.startswith("_")}
    return sorted(found)


def inventory() -> dict[str, list[str]]:
    import transformer_engine.pytorch as te

    ops = te.ops
    basic = sys.modules.get("transformer_engine.pytorch.ops.basic")
    fused = sys.modules.get("transformer_engine.pytorch.ops.fused")
    op_module = sys.modules["transformer_engine.pytorch.ops.op"]
    return {"basic": subclasses_in([m for m in (ops, basic) if m is not None], op_module.BasicOperation),
            "fused": subclasses_in([fused] if fused is not None else [], op_module.FusedOperation)}


if __name__ == "__main__":
    print(json.dumps(inventory()))
