"""The op database of `te.ops`, in the style of PyTorch's OpInfo: for each basic op the harness
can run without quantization or a second process, how to construct it at a given width, its
parameters, its extra inputs and outputs, and its plain-PyTorch reference; and for each fused op
TE's fusion passes build, the windows of basic ops its pass matches.

The entries are keyed by a short name (an op and its arguments: `extra_out_ip` is
`MakeExtraOutput(in_place=True)`) that generated pipeline ids are made of (cases/ops/generated.py).
What a loaded target holds is read off it (`repro coverage`); an op or fused op of a target that
has no entry here is reported with the reason from `NOT_COVERED`, or as having no entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cases.ops import references as ref
from cases.pipeline_info import BATCH, HIDDEN

if TYPE_CHECKING:
    import torch

GROUPS, SPLIT_SIZES = 2, (1, 3)  # GroupedLinear's groups and the rows each takes (of BATCH)
Shapes = tuple[tuple[str, tuple[int, ...]], ...]
OpReference = Callable[..., "tuple[torch.Tensor, tuple[torch.Tensor, ...]]"]  # (x, extra inputs, params)


@dataclass(frozen=True)
class OpInfo:
    key: str  # the name in pipeline ids: lowercase, no '.' or '-'
    op: str  # TE's class name in te.ops
    construct: Callable[[dict[str, Any], int, dict[str, Any]], Any]  # (target ops, input width, factory kwargs)
    reference: OpReference
    params: Callable[[int], Shapes] = lambda width: ()  # parameter name suffixes and shapes, in order
    out_width: Callable[[int], int | None] = lambda width: width  # None: the op cannot take this width
    extra_inputs: int = 0
    extra_shape: Callable[[int], tuple[int, ...]] = lambda width: (BATCH, width)  # of its extra input
    fixed_extra: tuple[int, ...] | None = None  # its extra input's integer values (split sizes), not random
    extra_outputs: int = 0
    in_place_extra_input: bool = False  # accumulates into the caller's extra input
    exposes_input: bool = False  # hands its input tensor back as an output
    requires: tuple[str, ...] = ()  # op features of the release (LoadedTarget.features)
    # Communicates over torch.distributed's default group: the worker starts one of world size 1 (gloo).
    process_group: bool = False


def _same(function: Callable[[torch.Tensor], torch.Tensor]) -> OpReference:
    return lambda x, extra, params: (function(x), ())


def _halved(width: int) -> int | None:
    return width // 2 if width % 2 == 0 and width >= 2 else None


def _unary(key: str, op: str, function: Callable[[torch.Tensor], torch.Tensor]) -> OpInfo:
    return OpInfo(key, op, lambda o, w, k: o[op](), _same(function))


def _gated(key: str, op: str, activation: str) -> OpInfo:
    return OpInfo(key, op, lambda o, w, k: o[op](), _same(lambda x: ref.gated(activation, x)), out_width=_halved)


def _row_scaled(key: str, op: str, function: Callable[[torch.Tensor], torch.Tensor],
                out_width: Callable[[int], int | None] = lambda width: width, **kwargs: Any) -> OpInfo:
    """An activation of TE's grouped MLP: its extra input holds one scale per row."""
    return OpInfo(key, op, lambda o, w, k: o[op](**kwargs),
                  lambda x, extra, params: (ref.row_scaled(function(x), extra[0]), ()),
                  out_width=out_width, extra_inputs=1, extra_shape=lambda width: (BATCH,))


def _grouped_linear(x: torch.Tensor, extra: Any, params: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[()]]:
    """Each group of rows (the split sizes) through its own weight and bias."""
    import torch

    weights, biases = params[:GROUPS], params[GROUPS:]
    rows = x.float().split([int(n) for n in extra[0].tolist()])
    out = [r @ w.float().t() + b.float() for r, w, b in zip(rows, weights, biases)]
    return torch.cat(out).to(x.dtype), ()


def _linear(x: torch.Tensor, extra: Any, params: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[()]]:
    return (x.float() @ params[0].float().t()).to(x.dtype), ()


OPS: dict[str, OpInfo] = {info.key: info for info in (
    OpInfo("identity", "Identity", lambda o, w, k: o["Identity"](), _same(lambda x: x), exposes_input=True),
    OpInfo("reshape", "Reshape", lambda o, w, k: o["Reshape"]((-1, w)), _same(lambda x: x.reshape(-1, x.shape[-1]))),
    OpInfo("extra_out", "MakeExtraOutput", lambda o, w, k: o["MakeExtraOutput"](),
           lambda x, extra, params: (x, (x,)), extra_outputs=1, exposes_input=True),
    OpInfo("extra_out_ip", "MakeExtraOutput", lambda o, w, k: o["MakeExtraOutput"](in_place=True),
           lambda x, extra, params: (x, (x,)), extra_outputs=1, exposes_input=True, requires=("in_place_kwarg",)),
    OpInfo("add_in", "AddExtraInput", lambda o, w, k: o["AddExtraInput"](),
           lambda x, extra, params: (x + extra[0], ()), extra_inputs=1, requires=("in_place_kwarg",)),
    OpInfo("add_in_ip", "AddExtraInput", lambda o, w, k: o["AddExtraInput"](in_place=True),
           lambda x, extra, params: (ref.add_in_place(x, extra[0]), ()), extra_inputs=1,
           in_place_extra_input=True, requires=("in_place_kwarg",)),
    OpInfo("scale", "ConstantScale", lambda o, w, k: o["ConstantScale"](0.5), _same(lambda x: x * 0.5)),
    # p=0: deterministic; a new tensor, as TE's Dropout returns (Identity hands its input back)
    OpInfo("dropout", "Dropout", lambda o, w, k: o["Dropout"](0.0), _same(lambda x: x.clone())),
    OpInfo("rmsnorm", "RMSNorm", lambda o, w, k: o["RMSNorm"](w, **k),
           lambda x, extra, params: (ref.rms_norm(x, params[0]), ()), params=lambda w: (("weight", (w,)),)),
    OpInfo("layernorm", "LayerNorm", lambda o, w, k: o["LayerNorm"](w, **k),
           lambda x, extra, params: (ref.layer_norm(x, params[0], params[1]), ()),
           params=lambda w: (("weight", (w,)), ("bias", (w,)))),
    OpInfo("l2norm", "L2Normalization", lambda o, w, k: o["L2Normalization"](), _same(ref.l2_normalization)),
    OpInfo("linear", "BasicLinear", lambda o, w, k: o["BasicLinear"](w, HIDDEN, **k), _linear,
           params=lambda w: (("weight", (HIDDEN, w)),), out_width=lambda w: HIDDEN),
    OpInfo("bias", "Bias", lambda o, w, k: o["Bias"](w, **k),
           lambda x, extra, params: ((x.float() + params[0].float()).to(x.dtype), ()),
           params=lambda w: (("bias", (w,)),)),
    _unary("gelu", "GELU", ref.gelu),
    _unary("qgelu", "QGELU", ref.qgelu),
    _unary("relu", "ReLU", ref.relu),
    _unary("srelu", "SReLU", ref.srelu),
    _unary("silu", "SiLU", ref.silu),
    _gated("glu", "GLU", "sigmoid"),
    _gated("geglu", "GEGLU", "gelu"),
    _gated("qgeglu", "QGEGLU", "qgelu"),
    _gated("reglu", "ReGLU", "relu"),
    _gated("sreglu", "SReGLU", "srelu"),
    _gated("swiglu", "SwiGLU", "silu"),
    OpInfo("clamped_swiglu", "ClampedSwiGLU", lambda o, w, k: o["ClampedSwiGLU"](limit=7.0, alpha=1.702),
           _same(ref.clamped_swiglu), out_width=_halved),
    OpInfo("grouped_linear", "GroupedLinear", lambda o, w, k: o["GroupedLinear"](GROUPS, w, HIDDEN, **k),
           _grouped_linear, out_width=lambda w: HIDDEN, extra_inputs=1, extra_shape=lambda w: (GROUPS,),
           fixed_extra=SPLIT_SIZES,
           params=lambda w: (*((f"weight{g}", (HIDDEN, w)) for g in range(GROUPS)),
                             *((f"bias{g}", (HIDDEN,)) for g in range(GROUPS)))),
    # Tensor parallelism at world size 1, where TE short-circuits: AllReduce hands its input back.
    OpInfo("all_reduce", "AllReduce", lambda o, w, k: o["AllReduce"](), _same(lambda x: x), exposes_input=True,
           process_group=True),
    OpInfo("all_gather", "AllGather", lambda o, w, k: o["AllGather"](), _same(lambda x: x.clone()),
           process_group=True),
    OpInfo("reduce_scatter", "ReduceScatter", lambda o, w, k: o["ReduceScatter"](), _same(lambda x: x.clone()),
           process_group=True),
    OpInfo("situglu", "SiTUGLU", lambda o, w, k: o["SiTUGLU"](), _same(ref.situ_glu), out_width=_halved),
    _row_scaled("scaled_swiglu", "ScaledSwiGLU", lambda x: ref.gated("silu", x), _halved),
    _row_scaled("scaled_situglu", "ScaledSiTUGLU", ref.situ_glu, _halved),
    _row_scaled("scaled_clamped_qgeglu", "ScaledClampedQGeGLU", ref.clamped_swiglu, _halved),
    _row_scaled("scaled_srelu", "ScaledSReLU", ref.srelu),
    _row_scaled("scaled_tanh_srelu", "ScaledTanhSReLU", lambda x: ref.tanh_srelu(x, 2.0), tanh_clamp_scale=2.0),
)}

# TE's basic ops the database has no entry for, and why (an op of a target in neither is
# reported as having no entry).
NOT_COVERED: dict[str, str] = {
    **dict.fromkeys(("Quantize", "CastFloat8"), "casts to FP8 only under fp8_autocast, which a device without FP8 refuses"),
    "AddInPlace": "AddExtraInput's name before 2.7, in place by design: the database's add_in entries need the"
                  " in_place keyword",
}

# TE's activation ops its backward activation-bias pass fuses (`_fused_activations`).
_FUSIBLE_ACTIVATIONS = ("gelu", "relu")


@dataclass(frozen=True)
class Fusion:
    """A fused op and the windows of basic ops (database keys, in forward order) its pass matches."""

    fused_op: str  # TE's class name
    windows: tuple[tuple[str, ...], ...]
    condition: str  # what else the pass checks, as TE's source says
    unreachable: str | None = None  # why no call the harness makes can fire it


FUSIONS: tuple[Fusion, ...] = (
    Fusion("ForwardLinearBiasActivation", (("linear", "bias"),),
           "no row tensor parallelism; from 2.7 the weight in bfloat16 or float16"),
    Fusion("ForwardLinearBiasAdd", (("linear", "bias", "add_in_ip"), ("linear", "add_in_ip")),
           "AddExtraInput in place; no row tensor parallelism"),
    Fusion("ForwardLinearScaleAdd", (("linear", "scale", "add_in_ip"),), "AddExtraInput in place"),
    Fusion("BackwardLinearAdd", (("extra_out_ip", "linear"), ("extra_out", "linear")),
           "MakeExtraOutput in place (by design before 2.7); no column tensor parallelism"),
    Fusion("BackwardLinearScale", (("linear", "scale"),), "no column tensor parallelism"),
    Fusion("BackwardAddRMSNorm", (("extra_out", "rmsnorm"),), "MakeExtraOutput not in place"),
    *(Fusion(name, tuple(("linear", "bias", act) for act in _FUSIBLE_ACTIVATIONS),
             "the op before Bias quantizes its grad output",
             "fires only when the preceding op's grad output is quantized (FP8), which a device without FP8 refuses")
      for name in ("BackwardActivationBias", "BackwardBiasActivation")),
    *(Fusion(name, (), "Userbuffers communication",
             "needs Userbuffers, tensor-parallel communication across more than one process")
      for name in ("UserbuffersForwardLinear", "UserbuffersBackwardLinear")),
    *(Fusion(name, (), "GroupedLinear, a scaled GLU, GroupedLinear",
             "needs CUDA's cuDNN front end (CuTe DSL grouped GEMM kernels)")
      for name in ("ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8", "BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8",
                   "GroupedMLP_CuTeGEMMGLU", "GroupedMLP_CuTeGEMMUnary")),
)
FUSION_OF: dict[str, Fusion] = {f.fused_op: f for f in FUSIONS}
# TE's op classes the database builds, once each, in its order.
DATABASE_OPS: tuple[str, ...] = tuple(dict.fromkeys(info.op for info in OPS.values()))


def needs_process_group(keys: tuple[str, ...]) -> bool:
    """Whether a pipeline of these op keys communicates (over a group of world size 1)."""
    return any(OPS[k].process_group for k in keys)


def fusion_windows() -> list[tuple[str, ...]]:
    """Every window some pass matches, in the database's order, once each."""
    return list(dict.fromkeys(w for f in FUSIONS for w in f.windows))
