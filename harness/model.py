"""The run model: one vocabulary (outcomes, verdicts, roles) and the typed run file.

Everything that writes or reads a run uses these names. `Run` is the schema of
run.json (`repro.run/2`); `repro schema` prints its JSON Schema. Workers stream plain
dicts of `CaseResult`'s shape to results.jsonl; the controller validates them here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "repro.run/2"


class Outcome(StrEnum):
    """What was observed, before any prediction is consulted."""

    PASS = "pass"
    CRASH = "crash"
    WRONG_OUTPUT = "wrong_output"
    WRONG_GRAD = "wrong_grad"
    SIDE_EFFECT = "side_effect"
    HARNESS_ERROR = "harness_error"
    NOT_APPLICABLE = "not_applicable"  # the release lacks an op feature the case needs


class Verdict(StrEnum):
    """The observation judged against the regression's rule and the target's role."""

    REPRODUCED = "reproduced"  # the predicted symptom, on a target expected to have the bug
    FIXED = "fixed"  # an affected case passes on a target expected to carry the fix
    UNAFFECTED = "unaffected"  # a case the rules do not touch passes
    OTHER_FAILURE = "other_failure"  # an affected case failed, but not with the predicted symptom
    REGRESSION = "regression"  # a failure where a pass was expected
    UNEXPECTED_PASS = "unexpected_pass"  # an affected case passes on a target expected to have the bug
    HARNESS_ERROR = "harness_error"
    NOT_APPLICABLE = "not_applicable"
    # Another catalogue regression's exact symptom, on a tree expected to have that bug: named
    # (`attributed_to`), never counted for or against the regression whose case it is.
    KNOWN_BUG = "known_bug"
    # The case did not apply, yet the tree looks as if it should have (an op it lacks is there
    # under another name): the regression was not judged there.
    NOT_JUDGED = "not_judged"


BAD_VERDICTS = frozenset({Verdict.OTHER_FAILURE, Verdict.REGRESSION, Verdict.UNEXPECTED_PASS, Verdict.HARNESS_ERROR,
                          Verdict.NOT_JUDGED})


class Role(StrEnum):
    """What a target is expected to be, for one regression."""

    UNPATCHED = "unpatched"  # a release or tree that has the bug
    PATCHED = "patched"  # carries one of our patches that declares it fixes the regression
    FIXED_UPSTREAM = "fixed_upstream"  # a release from the first fixed one on, or a tree with a fix marker
    PREDATES = "predates"  # a release before the first affected one
    UNKNOWN = "unknown"  # nothing says which (the sweep judges every release this way)


class ErrorInfo(BaseModel):
    type: str
    message: str
    location: str | None = None  # innermost frame inside the target's TE tree, "transformer_engine/...py:LINE"
    traceback: str | None = None


class FrameInfo(BaseModel):
    """One frame of a Megatron client's traceback, from megatron/core/, transformer_engine/ or torch/ on."""

    file: str
    line: int
    function: str


class FrameRow(BaseModel):
    """One of the bug report's frames beside the frame observed for it."""

    expected_file: str
    expected_function: str
    report_line: int | None = None
    observed: str | None = None  # "file:line", or None when missing
    in_order: bool


class CaseResult(BaseModel):
    """One (case, target): the observation, the prediction and the verdict."""

    model_config = ConfigDict(extra="allow")  # the case's axis values are stored flat beside these

    case_id: str
    regression: str
    target: str
    outcome: Outcome
    failed_checks: list[str] = []
    details: dict[str, list[str]] = {}
    error: ErrorInfo | None = None
    side_effects: list[str] = []  # changes to the caller's tensors, also when a crash followed
    known_deviations: list[str] = []
    fused_ops: list[str] = []  # the fused ops TE's fuser ran instead of basic ops ("backward:BackwardAddRMSNorm")
    # CUDA calls the CPU backend answered for TE's files ("torch.cuda.synchronize() at transformer_engine/...:12")
    device_calls: list[str] = []
    # A generated pipeline's second oracle, TE's own ops one Sequential each: "agrees", "differs"
    # (its differences are in `details`, marked) or "failed: <error type>"; None for other cases.
    unfused_te: str | None = None
    expected: str  # "affected" or "unaffected"
    predicted: str | None = None  # the symptom the matching rule predicts
    rule: str | None = None
    role: Role
    verdict: Verdict
    verdict_reason: str = ""
    attributed_to: str | None = None  # the catalogue regression whose symptom the failure is, when not this one
    symptom: bool | None = None  # the predicted symptom of the case's own regression was observed, whatever the role
    note: str | None = None
    # Where the reference side came from when the judge did not compute it (Megatron's block: the
    # target's worker, whose reference the judge cannot vouch for); None: the judge computed it.
    reference_from: str | None = None
    coverage_gap: str | None = None  # a not-applicable case the tree may hold under another name (the verdict says so)
    duration_s: float = 0.0
    # Whether `repro show --script --standalone` can write this case's steps, and why not.
    standalone: bool | None = None
    standalone_refusal: str | None = None
    observations: dict[str, Any] | None = None  # a regression's own scenario: what its steps observed
    # The Megatron clients' crash only: its frames, the table against the report's, and
    # whether it is the report's error.
    frames: list[FrameInfo] | None = None
    frame_table: list[FrameRow] | None = None
    report_error: bool | None = None


class TargetInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    spec: str
    version: str
    fuser_sha: str
    patch: str | None = None
    patch_status: str
    patch_detail: str = ""
    backend: str
    source: str
    description: str = ""
    roles: dict[str, Role] = {}
    role_reasons: dict[str, str] = {}
    # The patch in two parts: its text against the tree, and the fix (see harness/targets/patching.py).
    patch_text: str = ""
    patch_text_detail: str = ""
    patch_fix: str = ""
    patch_fix_detail: str = ""
    provenance: dict[str, str] = {}  # path: trees: git_commit, git_branch, git_state, and a revision's source
    expectations: dict[str, str] = {}  # the fork config's [expect]: regression -> fixed | affected


class MegatronInfo(BaseModel):
    spec: str  # a release ("0.19.0") or path:DIR
    version: str
    source: str


class Environment(BaseModel):
    model_config = ConfigDict(extra="allow")

    torch: str
    python: str
    platform: str
    machine: str
    targets: list[TargetInfo]
    megatron: MegatronInfo | None = None  # the megatron-core the Megatron cases imported


class RegressionInfo(BaseModel):
    id: str
    title: str
    upstream: str
    affected: str | None = None  # the affected releases as specifier sets, "||" between ranges
    first_affected: str | None  # the lowest bound of `affected`, for renderers of older runs
    first_fixed: str | None  # the upper bound of its lowest range
    patches: list[str]
    axes: list[str] = []  # the axes its case ids are built from, in order
    scenario: str | None = None


class Run(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_: str = Field(SCHEMA, alias="schema")
    matrix: str
    complete: bool
    missing: int | None
    problems: list[str] = []
    # Records not counted: refused by a session's controller, or in results.jsonl without the run's seal.
    rejected: list[str] = []
    environment: Environment
    regressions: list[RegressionInfo]
    excluded: dict[str, dict[str, int]] = {}  # regression -> reason -> count of combinations not generated
    headlines: dict[str, list[str]] = {}
    results: list[CaseResult]
    not_run: list[dict[str, str]] = []  # {target, case_id, reason} for each selected case without a record
    target_problems: list[dict[str, str]] = []  # {target, problem}: a target none of whose cases could run
    started_at: str | None = None
    elapsed_s: float | None = None
    summary: dict[str, Any] | None = None  # repro.reports.summarize: status, fail reasons, counts
    perf: dict[str, Any] | None = None  # `repro run --perf`


def json_schema() -> dict[str, Any]:
    return Run.model_json_schema(by_alias=True)
