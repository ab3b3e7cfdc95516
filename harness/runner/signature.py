"""A stored result's signature: what a case did, without the verdict, the role or the error's line.
One definition, read by `repro bisect`, `repro diff` and the review.

Outcome, error type, the file of the innermost TE frame and the failed checks. Never the
verdict or the role: every upstream commit between two releases reads the next release's
`.dev0` version, so its role is `unknown` where a release has `unpatched`, and the same
failure gets another verdict. Nor the error's line: commits that edit the file move it
without changing the behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

Signature = tuple[str, ...]  # outcome, error type, error file, then the failed checks
UNJUDGED = ("harness_error", "not_applicable")
_LINE = re.compile(r":\d+$")


def signature(record: Mapping[str, Any]) -> Signature | None:
    """A stored result's signature; None when the result judges nothing (harness_error, not_applicable)."""
    if record["outcome"] in UNJUDGED:
        return None
    error = record.get("error") or {}
    return (record["outcome"], error.get("type") or "", error_file(error.get("location")),
            *sorted(record.get("failed_checks") or ()))


def error_file(location: str | None) -> str:
    """`transformer_engine/pytorch/ops/fuser.py:511` -> `transformer_engine/pytorch/ops/fuser.py`."""
    return _LINE.sub("", location or "")


def signature_text(sig: Signature) -> str:
    outcome, kind, where, *checks = sig
    text = outcome + (f" {kind}" if kind else "") + (f" at {where}" if where else "")
    return text + (f" [{', '.join(checks)}]" if checks else "")
