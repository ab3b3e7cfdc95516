"""Frame for frame: an observed traceback against the bug report's (issue 22).

The report's traceback runs from Megatron's layer down to the fuser; its text adds that
it happens inside Megatron's `CheckpointFunction.forward` (tensor_parallel/random.py).
`frame_table` says, for each of those frames, where the observed traceback has it, or that
it is missing, and whether it comes in the report's order. Nothing is hidden: a missing or
out-of-order frame is a row that says so.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import asdict, dataclass
from typing import Any

# (file, function, the report's line or None). The report's TE lines (sequential.py:189,
# fuser.py:510/134) are the NPU fork's; upstream 2.13.0 has 187/511/141.
REPORT_FRAMES: tuple[tuple[str, str, int | None], ...] = (
    ("megatron/core/tensor_parallel/random.py", "forward", None),  # CheckpointFunction.forward
    ("megatron/core/transformer/transformer_layer.py", "_forward_attention", 626),
    ("megatron/core/extensions/transformer_engine.py", "forward", 790),
    ("transformer_engine/pytorch/ops/sequential.py", "forward", 189),
    ("transformer_engine/pytorch/ops/fuser.py", "__call__", 510),
    ("transformer_engine/pytorch/ops/fuser.py", "forward", 134),
)
REPORT_ERROR = ("RuntimeError", "you can only change requires_grad flags of leaf variables")
_ROOTS = ("/megatron/core/", "/transformer_engine/", "/site-packages/")
_FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


@dataclass(frozen=True)
class Frame:
    file: str  # shortened: from megatron/core/, transformer_engine/ or torch/ on
    line: int
    function: str
    code: str = ""


@dataclass(frozen=True)
class FrameRow:
    expected_file: str
    expected_function: str
    report_line: int | None
    observed: str | None  # "file:line", or None when missing
    in_order: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def short_path(path: str) -> str:
    """From megatron/core/ or transformer_engine/ on, or from site-packages/ on; else as is."""
    path = path.replace("\\", "/")
    for root in _ROOTS:
        index = path.rfind(root)
        if index >= 0:
            return path[index + len(root):] if root == "/site-packages/" else path[index + 1:]
    return path


def frames_of(error: BaseException | str) -> list[Frame]:
    """The frames of an exception, or of traceback text (prefixes such as `[rank0]:` are fine)."""
    if isinstance(error, BaseException):
        return [Frame(short_path(f.filename), f.lineno or 0, f.name, (f.line or "").strip())
                for f in traceback.extract_tb(error.__traceback__)]
    frames = []
    for match in _FRAME_LINE.finditer(error):
        frames.append(Frame(short_path(match["file"]), int(match["line"]), match["function"]))
    return frames


def frame_table(error: BaseException | str) -> list[FrameRow]:
    """Each report frame, where the observed traceback has it, and whether the order holds."""
    frames = frames_of(error)
    rows, cursor = [], 0
    for file, function, report_line in REPORT_FRAMES:
        hits = [i for i, f in enumerate(frames) if f.file.endswith(file) and f.function == function]
        after = [i for i in hits if i >= cursor]
        if after:
            index, in_order = after[0], True
            cursor = index + 1
        elif hits:
            index, in_order = hits[-1], False
        else:
            rows.append(FrameRow(file, function, report_line, None, False))
            continue
        rows.append(FrameRow(file, function, report_line, f"{frames[index].file}:{frames[index].line}", in_order))
    return rows


def matches_report(rows: list[FrameRow]) -> bool:
    return all(row.observed is not None and row.in_order for row in rows)


def layer_to_fuser(error: BaseException | str) -> list[Frame]:
    """The observed frames from Megatron's layer (`_forward_attention`) down to the last fuser.py
    frame: what `repro minimal --client` prints. All frames when either end is absent."""
    frames = frames_of(error)
    starts = [i for i, f in enumerate(frames) if f.file.endswith("transformer_layer.py")]
    ends = [i for i, f in enumerate(frames) if f.file.endswith("ops/fuser.py")]
    if not starts or not ends or ends[-1] < starts[0]:
        return frames
    return frames[starts[0]: ends[-1] + 1]
