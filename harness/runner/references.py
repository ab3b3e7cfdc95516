"""The run's references, as a session's controller reads them: computed once per run by the
reference process (harness.engine.reference), which the runner starts beside the sessions.

The controller waits for the file at its first record (the process is seconds ahead of any
worker, which must import torch and the target first), reads it once and checks its seal. A
reference process that failed (the runner then leaves `<file>.failed`), a file that does not
come, or one whose seal does not hold, means no shared references: the judge then computes
each case's reference itself (harness.runner.records.judged), in the same target-free process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

WAIT_S = 300.0
_loaded: dict[str, dict[str, Any]] = {}


def failed_marker(path: Path) -> Path:
    return path.with_name(path.name + ".failed")


def _load(path: Path, key: bytes | None) -> dict[str, Any]:
    from harness.engine.reference import read

    deadline = time.monotonic() + WAIT_S
    while not path.is_file() and not failed_marker(path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return (read(path, key) or {}) if path.is_file() else {}


def lookup(path: str | None, key: bytes | None, case_id: str) -> dict[str, Any] | None:
    """The reference side of `case_id` from the run's file, or None (not there: compute it)."""
    if not path:
        return None
    if path not in _loaded:
        _loaded[path] = _load(Path(path), key)
    return _loaded[path].get(case_id)
