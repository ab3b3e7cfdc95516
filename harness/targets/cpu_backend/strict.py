"""`StrictModule`: a module that answers only the names it was given.

Used where a module is absent from the environment but something imports names from it: a
fork config's `[standins]` for a module neither the fork nor the environment has, and
Megatron's own Triton kernel module (harness/megatron/loader.py). Any other name raises
`FidelityError` naming the target, the module and the symbol.
"""

from __future__ import annotations

import types
from typing import Any

from harness.errors import FidelityError


class StrictModule(types.ModuleType):
    """A module that refuses names it was not given, with a `FidelityError`.

    Dunder look-ups (`__file__`, `__path__`, ...) get a plain AttributeError:
    `inspect`, and through it `torch.utils.checkpoint`, probe them on every module.
    """

    def __init__(self, name: str, target: str, symbols: dict[str, Any]):
        super().__init__(name)
        self.__dict__.update(symbols)
        self.__dict__["_standin_target"] = target

    def __getattr__(self, symbol: str) -> Any:
        if symbol.startswith("__") and symbol.endswith("__"):
            raise AttributeError(symbol)
        raise FidelityError(self._standin_target, self.__name__, symbol)
