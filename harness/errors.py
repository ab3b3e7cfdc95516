"""Error types that the command line turns into one-line messages.

`UsageError` is a mistake in what the user asked for (exit status 2).
`TargetLoadError` means a target could not be prepared or imported; it is
reported as the target's load status, never as a traceback.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: the message says what was wrong and what is valid."""


class TargetLoadError(Exception):
    """A target could not be fetched, patched or imported."""


class FidelityError(TargetLoadError):
    """A target asked the CPU backend for a name it does not stand in for."""

    def __init__(self, target: str, module: str, symbol: str) -> None:
        self.target, self.module, self.symbol = target, module, symbol
        super().__init__(
            f"target {target}: module {module} needs {symbol!r}, "
            "which the CPU backend does not provide"
        )
