"""Turn an exception into the record the reports show: type, message, innermost TE frame."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any


def innermost_te_frame(exc: BaseException, te_dir: Path | None) -> str | None:
    """`transformer_engine/.../file.py:line` of the deepest frame inside the target's TE tree."""
    if te_dir is None:
        return None
    root = str(te_dir.resolve())
    location = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = str(Path(frame.filename).resolve())
        if path.startswith(root):
            location = f"transformer_engine{path[len(root):]}:{frame.lineno}"
    return location


def error_record(exc: BaseException, te_dir: Path | None) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "location": innermost_te_frame(exc, te_dir),
        "traceback": "".join(traceback.format_exception(exc)),
    }
