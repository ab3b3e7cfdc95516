"""What a te.ops pipeline is, as data (in the style of PyTorch's ModuleInfo): how to build it
from a target's ops, its plain-PyTorch reference, and the structural facts the rules read.
The hand-written catalogue (cases/pipelines.py) and the generated one (cases/ops/generated.py)
both hold these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HIDDEN = 16
BATCH = 4  # rows of every pipeline's input
Tensors = Sequence["torch.Tensor"]


@dataclass(frozen=True)
class PipelineInfo:
    name: str
    description: str
    build: Callable[[dict[str, Any], dict[str, Any]], list[torch.nn.Module]]  # (ops, factory kwargs)
    reference: Callable[[torch.Tensor, Tensors, Tensors], tuple[torch.Tensor, ...]]  # (x, extra inputs, params)
    num_extra_inputs: int = 0
    exposes_input: bool = False
    in_place_extra_input: bool = False
    ops_per_group: tuple[int, ...] = (1,)  # basic ops in each fuser group
    makes_extra_output: bool = False  # MakeExtraOutput hands a tensor back beside the main output
    extra_output_is_main_output: bool = False  # MakeExtraOutput is the last op: both outputs are one tensor
    requires: tuple[str, ...] = ()  # op features of the target (see LoadedTarget.features)
    # The parameters the built pipeline holds, in order, as te.ops.Sequential names them: the harness
    # sets their values (harness.engine.calls), so the reference needs no target to know them.
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_shape: tuple[int, ...] = (BATCH, HIDDEN)
    # Generated pipelines only (cases/ops/generated.py): the op database's keys, in order, and the
    # shape of each extra input.
    op_keys: tuple[str, ...] = ()
    extra_input_shapes: tuple[tuple[int, ...], ...] = ()
    fixed_extra_input: tuple[int, ...] | None = None  # the extra input's integer values (split sizes), not random

    @property
    def fuser_groups(self) -> int:
        return len(self.ops_per_group)

    @property
    def has_params(self) -> bool:
        """Whether the pipeline holds parameters: read off `params`, which names every one (without
        building the pipeline, which can need torch; GroupedLinear's weights count)."""
        return bool(self.params)

    @property
    def generated(self) -> bool:
        return bool(self.op_keys)


def ops_used(info: PipelineInfo) -> set[str]:
    """The target ops a pipeline builds, found by building it against a recorder."""

    class Recorder(dict):
        def __missing__(self, name: str) -> Callable[..., None]:
            self[name] = lambda *args, **kwargs: None
            return self[name]

    recorder = Recorder()
    info.build(recorder, {})
    return set(recorder)

