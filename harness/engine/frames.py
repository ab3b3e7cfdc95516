"""Turn an exception into the record the reports show: type, message, innermost TE frame."""

from __future__ import annotations

import functools
import os
import traceback
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=4096)
def _real_path(filename: str) -> str:
    # One resolution per file: resolving stats every component, and a traceback repeats its files.
    return os.path.realpath(filename)


def innermost_te_frame(exc: BaseException, te_dir: Path | None) -> str | None:
    """`transformer_engine/.../file.py:line` of the deepest frame inside the target's TE tree."""
    if te_dir is None:
        return None
    root = _real_path(str(te_dir))
    location = None
    for frame, line in traceback.walk_tb(exc.__traceback__):  # no source lines needed here
        path = _real_path(frame.f_code.co_filename)
        if path.startswith(root + os.sep):
            location = f"transformer_engine{path[len(root):]}:{line}"
    return location


def error_record(exc: BaseException, te_dir: Path | None) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "location": innermost_te_frame(exc, te_dir),
        "traceback": "".join(traceback.format_exception(exc)),
    }
