"""Compare two runs the way `asv compare` does: a header that says what is compared (both
runs' targets, their provenance and fuser.py hashes, how many results were paired), then
per paired (target, case) the changes, kept apart by kind.

Targets are paired by `--map A=B`, else by the same spec, else by the same role when that
role is held by one target in each run (two worktrees of a fork have different specs). A
result is compared by its signature: pass, not run (not applicable or not judged), or a
failure's outcome, error type and file and failed checks (never its line). The kinds (`kind_of`):
pass → fail is a `new failure`; fail → pass `newly fixed`; one failure → another `changed
failure` (a change that needs a look, never "passed at base"); ran → not run `stopped running`
(lost coverage); not run → pass `started running`; a verdict that changed on the same signature
(a role changed) `other change`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from harness.errors import UsageError
from harness.runner.signature import signature as case_signature
from harness.runner.signature import signature_text
from harness.runner.textsafe import printable
from repro import reports

KINDS = ("new failure", "changed failure", "stopped running", "newly fixed", "started running", "new case",
         "removed case", "other change")
# The kinds that fail a diff and a review: what the head does worse (lost coverage fails a review unless accepted).
FAILING_KINDS = ("new failure", "changed failure", "stopped running")
NOT_RUN = ("not_applicable", "not_judged", "skipped")


@dataclass(frozen=True)
class Pair:
    a: str | None  # the target in run A, None when only B has it
    b: str | None
    how: str  # "--map", "same spec", "same role ROLE", or "unpaired"


@dataclass(frozen=True)
class Change:
    kind: str
    target: str  # the spec, or "A -> B" when the pair's specs differ
    case_id: str
    before: str  # "outcome/verdict [error type at location] [failed checks]", or "-" when absent
    after: str


def parse_maps(items: list[str] | None) -> list[tuple[str, str]]:
    maps = []
    for item in items or []:
        a, sep, b = item.partition("=")
        if not sep or not a or not b:
            raise UsageError(f"--map {item!r}: write --map A_SPEC=B_SPEC (a target of run A, then one of run B)")
        maps.append((a, b))
    return maps


def pair_targets(a: dict[str, Any], b: dict[str, Any], maps: list[tuple[str, str]] | None = None) -> list[Pair]:
    """Every target of both runs, paired as the module docstring says; unpaired ones last."""
    left, right = reports.target_specs(a), reports.target_specs(b)
    pairs: list[Pair] = []
    for spec_a, spec_b in maps or []:
        for spec, run_specs, name in ((spec_a, left, "A"), (spec_b, right, "B")):
            if spec not in run_specs:
                raise UsageError(f"--map: {spec!r} is not a target of run {name}; its targets: {', '.join(run_specs)}")
        pairs.append(Pair(spec_a, spec_b, "--map"))
    rest_a = [s for s in left if s not in {p.a for p in pairs}]
    rest_b = [s for s in right if s not in {p.b for p in pairs}]
    for spec in [s for s in rest_a if s in rest_b]:
        pairs.append(Pair(spec, spec, "same spec"))
    rest_a = [s for s in rest_a if s not in {p.a for p in pairs}]
    rest_b = [s for s in rest_b if s not in {p.b for p in pairs}]
    roles_a = {s: reports.role_text(a, s) for s in rest_a}
    roles_b = {s: reports.role_text(b, s) for s in rest_b}
    for spec, role in roles_a.items():
        mates = [s for s, r in roles_b.items() if r == role]
        if len(mates) == 1 and list(roles_a.values()).count(role) == 1:
            pairs.append(Pair(spec, mates[0], f"same role {role}"))
    paired_a, paired_b = {p.a for p in pairs}, {p.b for p in pairs}
    pairs += [Pair(s, None, "unpaired") for s in left if s not in paired_a]
    pairs += [Pair(None, s, "unpaired") for s in right if s not in paired_b]
    return pairs


def _facts(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a change is judged on: the signature (outcome, error type and file, failed checks) and the verdict."""
    return record["outcome"], record["verdict"], case_signature(record)


def state(record: dict[str, Any] | None) -> str:
    if record is None:
        return "-"
    text = f"{record['outcome']}/{record['verdict']}"
    if error := record.get("error"):
        text += f" {error.get('type')}" + (f" at {error['location']}" if error.get("location") else "")
    if record.get("failed_checks"):
        text += f" [{', '.join(record['failed_checks'])}]"
    return text


def ran(record: dict[str, Any]) -> bool:
    return record["outcome"] not in NOT_RUN and record["verdict"] not in NOT_RUN


def signature(record: dict[str, Any] | None) -> str:
    """What a case did, without the verdict or the error's line (harness/runner/signature.py):
    `pass`, `not run`, or the failure's outcome, error type and file, and failed checks."""
    if record is None:
        return "-"
    sig = case_signature(record)
    if not ran(record) or sig is None:
        return "not run"
    return "pass" if record["outcome"] == "pass" else signature_text(sig)


def kind_of(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """A pure function of the two stored results (asv's `_is_result_better` in spirit)."""
    if a is None:
        return "new failure" if b and ran(b) and b["outcome"] != "pass" else "new case"
    if b is None:
        return "removed case"
    before, after = signature(a), signature(b)
    if before == after:
        return "other change"
    if after == "not run":
        return "stopped running"
    if after == "pass":
        return "started running" if before == "not run" else "newly fixed"
    return "new failure" if before in ("pass", "not run") else "changed failure"


@dataclass(frozen=True)
class Comparison:
    pairs: list[Pair]
    changes: list[Change]
    compared: int  # results present in both runs for a paired target


def compare(a: dict[str, Any], b: dict[str, Any], maps: list[tuple[str, str]] | None = None) -> Comparison:
    """Every paired (target, case) whose facts differ, or that only one run has."""
    pairs = pair_targets(a, b, maps)
    index_a = {(r["target"], r["case_id"]): r for r in a["results"]}
    index_b = {(r["target"], r["case_id"]): r for r in b["results"]}
    changes, compared = [], 0
    for pair in pairs:
        if pair.a is None or pair.b is None:
            continue
        label = pair.a if pair.a == pair.b else f"{pair.a} -> {pair.b}"
        cases_a = [c for t, c in index_a if t == pair.a]
        cases_b = [c for t, c in index_b if t == pair.b]
        for case_id in cases_a + [c for c in cases_b if c not in set(cases_a)]:
            ra, rb = index_a.get((pair.a, case_id)), index_b.get((pair.b, case_id))
            compared += bool(ra and rb)
            if ra and rb and _facts(ra) == _facts(rb):
                continue
            changes.append(Change(kind_of(ra, rb), label, case_id, state(ra), state(rb)))
    order = {p.a or p.b: i for i, p in enumerate(pairs)}
    changes.sort(key=lambda c: (KINDS.index(c.kind), order.get(c.target.split(" -> ")[0], len(order)), c.case_id))
    return Comparison(pairs, changes, compared)


def _target_line(run: dict[str, Any], spec: str | None) -> str:
    if spec is None:
        return "-"
    target = reports.target_info(run, spec)
    facts = [f"fuser.py {target.get('fuser_sha', '?')}", f"role {reports.role_text(run, spec)}"]
    if provenance := reports.provenance_text(target):
        facts.append(provenance)
    return f"{spec} ({', '.join(facts)})"


def header(comparison: Comparison, a: dict[str, Any], b: dict[str, Any],
           names: tuple[str, str] = ("A", "B")) -> tuple[list[str], list[list[str]]]:
    """The lines above the changes, and the target pairing table's rows."""
    lines = []
    for name, run in zip(names, (a, b), strict=True):
        lines.append(f"{name}: matrix {run.get('matrix', '?')}, started {run.get('started_at') or '?'},"
                     f" {len(run['results'])} results")
        if note := reports.incomplete_note(run):
            lines.append(f"{name}: {note}")
    lines.append(f"{comparison.compared} results compared, on {sum(bool(p.a and p.b) for p in comparison.pairs)}"
                 " paired targets")
    rows = [[_target_line(a, p.a), _target_line(b, p.b), p.how] for p in comparison.pairs]
    return lines, rows


def counts_line(changes: list[Change]) -> str:
    counts = {kind: sum(c.kind == kind for c in changes) for kind in KINDS}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)


def render_diff(comparison: Comparison, a: dict[str, Any], b: dict[str, Any], fmt: str = "text") -> str:
    lines, rows = header(comparison, a, b)
    changes = comparison.changes
    change_rows = printable([[c.kind, c.target, c.case_id, c.before, c.after] for c in changes])
    rows = printable(rows)
    change_headers = ["change", "target", "case", "A", "B"]
    if fmt == "md":
        from repro.render_md import code, plain, table

        out = ["## repro diff", "", *(f"- {plain(line)}" for line in lines), "",
               *table(["A target", "B target", "paired by"], [[plain(c) for c in r] for r in rows]), ""]
        if not changes:
            return "\n".join(out + ["No outcome or verdict changed (nor an error type, location or failed check)."]) + "\n"
        out += [f"**{counts_line(changes)}**", "",
                *table(change_headers, [[plain(r[0]), code(r[1]), code(r[2]), code(r[3]), code(r[4])]
                                        for r in change_rows])]
        return "\n".join(out) + "\n"
    out = [*lines, "", tabulate(rows, headers=["A target", "B target", "paired by"]), ""]
    if not changes:
        return "\n".join(out + ["no outcome or verdict changed (nor an error type, location or failed check)"]) + "\n"
    out += [counts_line(changes), "", tabulate(change_rows, headers=change_headers)]
    return "\n".join(out) + "\n"


def exit_status(changes: list[Change], a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> int:
    """1 on a new or changed failure or lost coverage, or when either run is incomplete (its
    missing results are no "removed cases")."""
    incomplete = any(run is not None and reports.incomplete_note(run) for run in (a, b))
    return 1 if incomplete or any(c.kind in FAILING_KINDS for c in changes) else 0
