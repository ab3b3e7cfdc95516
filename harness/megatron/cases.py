"""A Megatron client case as the engine's Subject: Megatron's own modules on the test side, their
reference (plain torch for the norm, the same block without recompute for the block) on the
other, built from the same weights (harness/megatron/clients.py).

Imported only by processes that run Megatron cases. Megatron is imported after the process's
TE target (it probes TE at import), from the source the run was given ($TE_REPRO_MEGATRON).
"""

from __future__ import annotations

from typing import Any

from cases.case import Case
from harness.engine.subject import DTYPES, Subject, import_megatron
from harness.megatron import frames
from harness.megatron.clients import build_client
from harness.megatron.loader import loaded
from harness.targets.loader import LoadedTarget


def describe_error(exc: BaseException) -> dict[str, Any]:
    """What the reports' frame table needs, stored in the record: the observed frames (file,
    line, function), for each frame of the bug report's traceback where they have it, and whether
    the error is the report's own (its type and message)."""
    return {"frames": [{"file": f.file, "line": f.line, "function": f.function} for f in frames.frames_of(exc)],
            "frame_table": [row.as_dict() for row in frames.frame_table(exc)],
            "report_error": type(exc).__name__ == frames.REPORT_ERROR[0] and frames.REPORT_ERROR[1] in str(exc)}


def megatron_subject(case: Case, target: LoadedTarget, seed: int) -> Subject:
    import_megatron(case.device)
    megatron = loaded()
    assert megatron is not None
    # The block's recompute is its own config; the norm's is the engine's wrapper around it.
    own_recompute = case.recompute if case.client == "megatron_block" else "none"
    parts = build_client(case.client, target, megatron, recompute=own_recompute, dtype=DTYPES[case.dtype],
                         device=case.device, seed=seed)
    for params in (parts.test_params, parts.reference_params):
        for p in params.values():
            p.requires_grad_(case.params == "trainable")
    test_modules = tuple(m for name, m in parts.modules.items() if not name.startswith("reference"))
    return Subject(parts.test, parts.reference, dict(parts.test_params), dict(parts.reference_params),
                   parts.input_shape, describe_error, test_modules)
