"""An issue22-sized run in the repro.run/2 shape, built from the real records of the
run2-small fixture: about 6,400 cases x 4 targets, the affected ones crashing on the
unpatched target and fixed on the others. For measuring report sizes, not verdicts."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from tests.conftest import REPO

FIXTURE2 = REPO / "tests" / "fixtures" / "run2-small"
PIPELINES = ("fused_residual_rmsnorm", "fused_residual_rmsnorm_inplace", "residual_layernorm", "add_residual_rmsnorm",
             "add_residual_rmsnorm_inplace", "extra_output_only", "identity", "reshape", "rmsnorm",
             "linear_bias_extra", "split_fuser", "residual_mlp")
EXPOSING = {"fused_residual_rmsnorm", "fused_residual_rmsnorm_inplace", "residual_layernorm", "extra_output_only",
            "identity", "split_fuser", "residual_mlp"}
AXES = {"client": ("ops",), "pipeline": PIPELINES, "grad_mode": ("enabled", "no_grad", "inference_mode", "enable_grad_inside_no_grad"),
        "input": ("leaf", "leaf_requires_grad", "non_leaf", "view", "detached"), "params": ("trainable", "frozen"),
        "recompute": ("none", "checkpoint_reentrant", "checkpoint_non_reentrant", "megatron"),
        "sequence": ("single", "recompute_pattern"), "grad_form": ("dense", "expanded"),
        "dtype": ("float32", "bfloat16"), "device": ("cpu",)}


def issue22_sized_run(cases_per_target: int = 6400) -> dict[str, Any]:
    small = json.loads((FIXTURE2 / "run.json").read_text())
    by = {(r["target"], r["verdict"]): r for r in small["results"]}
    combos = [dict(zip(AXES, values)) for values in itertools.product(*AXES.values())
              if values[2] == "enabled" or values[5] == "none"][:cases_per_target]
    results = []
    for spec in [t["spec"] for t in small["environment"]["targets"]]:
        for n, axes in enumerate(combos):
            affected = axes["pipeline"] in EXPOSING and axes["input"] in ("non_leaf", "view", "leaf_requires_grad")
            verdict = ("reproduced" if spec == "te-2.13.0" else "fixed") if affected else "unaffected"
            record = copy.deepcopy(by[(spec, verdict)])
            case_id = "issue22:" + "-".join(axes.values())
            record.update(axes, case_id=case_id, duration_s=round(0.002 + (n % 97) / 10000, 6))
            results.append(record)
    small["results"] = results
    small["summary"] = None
    return small
