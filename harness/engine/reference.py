"""The plain-PyTorch reference of a te.ops call case, computed where no target was ever imported.

`python -m harness.engine.reference CASES OUT [--seal-fd FD]`: the runner starts it once per run,
beside the target sessions, for every case whose reference needs no target (`independent`);
it writes each case's reference side (as plain data, harness.engine.wire) keyed by case id,
so every target's controller compares against the same values, computed once. The file is
sealed with the run's key (harness.runner.seal), read from an inherited pipe: a target that
writes into the run dir can spoil the file, never forge it, and a spoiled or missing file only
means the controller computes the reference itself.

The cases whose reference is TE itself (Megatron's block without recompute) or whose steps a
regression builds beside the target's (a scenario's own trial) run their reference in the
target's worker; their comparison is still the controller's.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import marshal
import os
from pathlib import Path
from typing import Any

import torch

from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regressions import REGRESSIONS
from harness.engine import calls, wire
from harness.engine.frames import error_record
from harness.engine.subject import DTYPES


def independent(case: Case) -> bool:
    """Whether the case's reference is plain PyTorch that needs no target: the call scenario on a
    te.ops pipeline."""
    return REGRESSIONS[case.regression].scenario.trial is None and case.client == "ops"


def parameters(case: Case) -> dict[str, torch.Tensor]:
    """The pipeline's parameters with the case's values, by the pipeline's own names."""
    pipeline = PIPELINES[case.pipeline]
    values = calls.parameter_values(case, pipeline.params, DTYPES[case.dtype])
    return {name: v.requires_grad_(case.params == "trainable") for (name, _), v in zip(pipeline.params, values)}


def reference_side(case: Case) -> dict[str, Any]:
    """The reference's side of one call case, packed; or {"error": ...} when it failed itself."""
    pipeline = PIPELINES[case.pipeline]
    params = parameters(case)
    ordered = list(params.values())
    values, residual = calls.input_values(case, pipeline.input_shape, DTYPES[case.dtype])
    side, error = calls.observe_side(case, lambda x, *extra: pipeline.reference(x, extra, ordered),
                                     calls.make_inputs(case, values, residual), params)
    return {"error": error_record(error, None)} if error is not None else wire.pack(side)


def _mac(body: bytes, key: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def write(path: Path, references: dict[str, Any], key: bytes | None) -> None:
    """Written whole (a temporary file and a rename), its seal beside it in the first line."""
    body = marshal.dumps(references)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes((_mac(body, key) if key else "").encode() + b"\n" + body)
    os.replace(temporary, path)


def read(path: Path, key: bytes | None) -> dict[str, Any] | None:
    """The references, or None when the file is missing, unsealed or spoiled."""
    try:
        seal, _, body = path.read_bytes().partition(b"\n")
        if key is not None and not hmac.compare_digest(seal.decode(), _mac(body, key)):
            return None
        references = marshal.loads(body)
    except (OSError, ValueError, EOFError, TypeError, UnicodeDecodeError):
        return None
    return references if isinstance(references, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path, help="JSON list of case dicts")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seal-fd", type=int, default=-1)
    args = parser.parse_args(argv)
    from harness.runner import seal

    key = seal.read_key(args.seal_fd) if args.seal_fd >= 0 else None
    torch.set_num_threads(1)  # tiny tensors: the parallelism is the run's processes
    cases = [Case(**fields) for fields in json.loads(args.cases.read_text())]
    references = {case.case_id: reference_side(case) for case in dict.fromkeys(cases) if independent(case)}
    write(args.out, references, key)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
