"""Pipelines generated from the op database (cases/ops/database.py), not written by hand.

- every op of the database alone;
- every valid pipeline of up to three ops that holds a window some fusion pass matches;
- a seeded sample of longer ones (`LONGER` of four to six ops; the same seed gives the same
  pipelines on every machine).

A pipeline's name is `gen.` and its op keys joined by dots (`gen.linear.bias.add_in_ip`), so
its id is stable, says what it builds, and any valid sequence of keys names a pipeline
(`pipeline_of`), which is what `repro shrink` tries. A sequence is valid when each op takes the
width the previous one gives and it holds at most one extra input (the call makes one).
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import TYPE_CHECKING, Any

from cases.ops.database import OPS, fusion_windows
from cases.pipeline_info import BATCH, HIDDEN, PipelineInfo

if TYPE_CHECKING:
    import torch

PREFIX = "gen."
SEED = 22
LONGER = 24
MAX_WINDOW_PIPELINE = 3


def name_of(keys: tuple[str, ...]) -> str:
    return PREFIX + ".".join(keys)


def keys_of(name: str) -> tuple[str, ...] | None:
    """The op keys a generated pipeline's name holds, or None when it is not one."""
    if not name.startswith(PREFIX):
        return None
    keys = tuple(name[len(PREFIX):].split("."))
    return keys if all(k in OPS for k in keys) else None


def widths(keys: tuple[str, ...]) -> list[int] | None:
    """The input width of each op and the output's, or None when some op cannot take its input."""
    found = [HIDDEN]
    for key in keys:
        out = OPS[key].out_width(found[-1])
        if out is None:
            return None
        found.append(out)
    return found


def valid(keys: tuple[str, ...]) -> bool:
    return bool(keys) and widths(keys) is not None and sum(OPS[k].extra_inputs for k in keys) <= 1


@functools.cache
def pipeline_of(keys: tuple[str, ...]) -> PipelineInfo:
    """The pipeline of a valid sequence of op keys: built from the target's ops, its reference
    the database's references in order, its parameters named as te.ops.Sequential names them."""
    sizes = widths(keys)
    if sizes is None or not valid(keys):
        raise ValueError(f"not a valid op sequence: {'.'.join(keys)}")
    infos = [OPS[k] for k in keys]
    params = tuple((f"{i}.{suffix}", shape) for i, (info, w) in enumerate(zip(infos, sizes))
                   for suffix, shape in info.params(w))
    extra_shapes = tuple(info.extra_shape(w) for info, w in zip(infos, sizes) for _ in range(info.extra_inputs))

    def build(ops: dict[str, Any], factory: dict[str, Any]) -> list[Any]:
        return [info.construct(ops, w, factory) for info, w in zip(infos, sizes)]

    def reference(x: torch.Tensor, extra: Any, values: Any) -> tuple[torch.Tensor, ...]:
        extras, parameters = iter(extra), iter(values)
        outputs: list[torch.Tensor] = []
        for info, w in zip(infos, sizes):
            taken = [next(parameters) for _ in info.params(w)]
            x, more = info.reference(x, [next(extras) for _ in range(info.extra_inputs)], taken)
            outputs += more
        return (x, *outputs)

    return PipelineInfo(
        name_of(keys), "[" + ", ".join(f"{i.op}" + ("(in_place=True)" if k.endswith("_ip") else "")
                                       for k, i in zip(keys, infos)) + "]: generated",
        build, reference,
        num_extra_inputs=len(extra_shapes),
        exposes_input=any(i.exposes_input for i in infos),
        in_place_extra_input=any(i.in_place_extra_input for i in infos),
        ops_per_group=(len(keys),),
        makes_extra_output=any(i.extra_outputs for i in infos),
        extra_output_is_main_output=infos[-1].extra_outputs > 0,
        requires=tuple(dict.fromkeys(r for i in infos for r in i.requires)),
        params=params,
        input_shape=(BATCH, HIDDEN),
        op_keys=keys,
        extra_input_shapes=extra_shapes,
        fixed_extra_input=next((i.fixed_extra for i in infos if i.fixed_extra is not None), None),
    )


def _around_windows() -> list[tuple[str, ...]]:
    """Every sequence of up to MAX_WINDOW_PIPELINE ops that holds a fusion window."""
    found = []
    for window in fusion_windows():
        room = MAX_WINDOW_PIPELINE - len(window)
        for before in range(room + 1):
            for after in range(room - before + 1):
                for pre in itertools.product(OPS, repeat=before):
                    for post in itertools.product(OPS, repeat=after):
                        found.append((*pre, *window, *post))
    return found


def _longer(seed: int, count: int) -> list[tuple[str, ...]]:
    rng = random.Random(seed)
    keys, found = sorted(OPS), dict[tuple[str, ...], None]()
    while len(found) < count:
        candidate = tuple(rng.choice(keys) for _ in range(rng.randint(4, 6)))
        if valid(candidate):
            found[candidate] = None
    return list(found)


def generated_keys(seed: int = SEED, longer: int = LONGER) -> list[tuple[str, ...]]:
    singles = [(k,) for k in OPS]
    return [keys for keys in dict.fromkeys([*singles, *_around_windows(), *_longer(seed, longer)]) if valid(keys)]


def fusion_window_pipelines() -> tuple[str, ...]:
    """The pipelines that are exactly one fusion window."""
    return tuple(name_of(w) for w in fusion_windows() if valid(w))


GENERATED: dict[str, PipelineInfo] = {name_of(keys): pipeline_of(keys) for keys in generated_keys()}
