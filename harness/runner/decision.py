"""The review's one word, decided by a table.

`ReviewState` holds everything the word may depend on: whether each side loads, how much each
side judged, each regression's state at base and at head, each patch's state at both, the
failure signatures and how the sync changed them, and what is missing. `RULES` is the table
from that state to an outcome, first match wins; `decide` is a pure function of the state,
and every output (review.md, review.json, the run's report banners, junit, the terminal's last
line and the exit status) reads its `Decision`. The README renders the table (`rules_markdown`).

Why this order: a head that does not load cannot be merged whatever else is known (when base
does not load either, the sync did not break it and nothing about the merge can be said, so
that is "Cannot judge"); a side that judged nothing leaves nothing to compare; a fix the fork
carried at base and loses at head is a certain regression whether or not a case shows it, and
a bug that is back is one a case shows; a run missing results cannot vouch for what it lacks;
only then do changed failures and lost coverage ask for a look. Failures that are the same at
base and head (standing), and those raised in a fork's own kernel provider, never fail a
review by themselves; a fork's kernels failing what base judged asks for a look (those cases
went unjudged), never counted as the sync's regressions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

HEADLINE_LIMIT = 120  # the first line of every output, in characters

# Each regression's state on one side, from the cases judged there.
REPRODUCES, FIXED, FIXED_UPSTREAM, PREDATES, UNJUDGED = "reproduces", "fixed", "fixed_upstream", "predates", "unjudged"
REGRESSION_STATES = (REPRODUCES, FIXED, FIXED_UPSTREAM, PREDATES, UNJUDGED)
NOT_BUGGY = (FIXED, FIXED_UPSTREAM, PREDATES)
# A patch's text against one side: it applies, our patch is in the tree, or it does not apply
# (conflicts: no fix recognised there; stale: a fix is recognised by a marker our patch also adds).
APPLIES, PRESENT, CONFLICTS, STALE = "applies", "present", "conflicts", "stale"
PATCH_STATES = (APPLIES, PRESENT, CONFLICTS, STALE)
CARRIED = (APPLIES, PRESENT)  # the fork carries the fix at base: as a patch that applies, or in the tree
# How the sync changed a failure signature (head's failing cases against base's).
NEW, CHANGED, STANDING, FIXED_BY_SYNC, STOPPED, STARTED = (
    "new", "changed", "standing", "fixed", "stopped running", "started running")
CHANGES = (NEW, CHANGED, STANDING, FIXED_BY_SYNC, STOPPED, STARTED)


class Outcome(StrEnum):
    DO_NOT_MERGE = "Do not merge"
    CANNOT_JUDGE = "Cannot judge"
    NEEDS_A_LOOK = "Needs a look"
    MERGE = "Merge"


SYMBOL = {Outcome.DO_NOT_MERGE: "❌", Outcome.CANNOT_JUDGE: "⚠", Outcome.NEEDS_A_LOOK: "❌", Outcome.MERGE: "✅"}


@dataclass(frozen=True)
class SideState:
    """One tree of the review (base or head, without patches)."""

    loads: bool = True
    load_cause: str = ""  # "file:line Error: message" when it does not load
    cases: int = 0  # the side's results
    judged: int = 0  # of them, judged for their own regression
    unjudged_cause: str = ""  # the most common reason a case was not judged
    kernels: str = "the harness's CPU stand-ins"  # who computed the kernels ("?" when it did not load)


@dataclass(frozen=True)
class RegressionState:
    id: str
    base: str  # one of REGRESSION_STATES
    head: str
    symptom: int = 0  # head's affected cases showing the regression's symptom
    affected: int = 0  # head's affected cases judged


@dataclass(frozen=True)
class PatchState:
    patch: str
    regression: str
    base: str  # one of PATCH_STATES
    head: str
    head_fix: bool = False  # upstream's (or the fork's own) fix is recognised at head
    where: str = ""  # where the text fails at head (file:line), when it does


@dataclass(frozen=True)
class SignatureGroup:
    change: str  # one of CHANGES
    signature: str
    cases: int
    regression: str = ""
    provider: str = ""  # the fork's kernel provider whose frame raised the failure ("" for TE's or ours)


@dataclass(frozen=True)
class ReviewState:
    base: SideState = field(default_factory=SideState)
    head: SideState = field(default_factory=SideState)
    regressions: tuple[RegressionState, ...] = ()
    patches: tuple[PatchState, ...] = ()
    signatures: tuple[SignatureGroup, ...] = ()
    missing: str = ""  # why results are missing or were refused; "" for a complete run
    other: tuple[str, ...] = ()  # further reasons for a look: unmet expectations, target problems, upstream tests
    accept_lost_coverage: bool = False


@dataclass(frozen=True)
class Rule:
    name: str
    when: str  # the condition, in words (the README's table)
    outcome: Outcome
    detail: Callable[[ReviewState], str | None]  # the first line's reason when the rule matches, else None


@dataclass(frozen=True)
class Decision:
    rule: str
    outcome: Outcome
    headline: str  # the first line of every output, at most HEADLINE_LIMIT characters
    reasons: tuple[str, ...]  # the reason of every rule that matched, first the deciding one
    standing: str  # "standing: N failures in k signatures, unchanged by this sync", or ""

    @property
    def status(self) -> str:
        return "PASS" if self.outcome is Outcome.MERGE else "FAIL"

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome is Outcome.MERGE else 1

    @property
    def word(self) -> str:
        return self.outcome.value


# ---- the state's questions, each a pure function ----

def patch_file(name: str) -> str:
    return f"patches/{name}.patch"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def counted(state: ReviewState) -> list[SignatureGroup]:
    """The signature groups the sync is answerable for: new and changed failures that are not a
    fork kernel provider's, and lost coverage unless accepted."""
    return [g for g in state.signatures if not g.provider and (
        g.change in (NEW, CHANGED) or (g.change == STOPPED and not state.accept_lost_coverage))]


def standing_line(state: ReviewState) -> str:
    """Failures the sync left as they were; none where a side judged nothing (they are what kept
    it from judging, counted by the rule that says so)."""
    standing = [g for g in state.signatures if g.change == STANDING and not g.provider]
    if not standing or not (state.base.judged and state.head.judged):
        return ""
    n = sum(g.cases for g in standing)
    return f"standing: {_plural(n, 'failure')} in {_plural(len(standing), 'signature')}, unchanged by this sync"


def _head_does_not_load(state: ReviewState) -> str | None:
    if state.head.loads or not state.base.loads:
        return None
    return f"head does not load: {state.head.load_cause}"


def _nothing_judged(state: ReviewState) -> str | None:
    if not state.base.loads and not state.head.loads:
        return f"neither tree loads: {state.head.load_cause}"
    empty = [name for name, side in (("base", state.base), ("head", state.head)) if not side.judged]
    if not empty:
        return None
    side = state.base if empty[0] == "base" else state.head
    cause = f"it does not load: {side.load_cause}" if not side.loads else side.unjudged_cause or "no case ran"
    return f"{' and '.join(empty)} judged 0 of {side.cases} cases: {cause}"


def _regression(state: ReviewState, rid: str) -> RegressionState | None:
    return next((r for r in state.regressions if r.id == rid), None)


def _fix_lost(state: ReviewState) -> str | None:
    lost = []
    for patch in state.patches:
        reg = _regression(state, patch.regression)
        still_buggy = reg is None or reg.head not in NOT_BUGGY
        if patch.base in CARRIED and patch.head in (CONFLICTS, STALE) and not patch.head_fix and still_buggy:
            lost.append(patch)
    if not lost:
        return None
    first, where = lost[0], f" ({lost[0].where})" if lost[0].where else ""
    more = f"; also lost: {', '.join(patch_file(p.patch) for p in lost[1:])}" if lost[1:] else ""
    return f"{patch_file(first.patch)} no longer applies{where} and {first.regression} is still upstream: port it{more}"


def _bug_back(state: ReviewState) -> str | None:
    for reg in state.regressions:
        if reg.base in NOT_BUGGY and reg.head == REPRODUCES:
            how = "back" if reg.base != PREDATES else "new"
            step = next((f"{'re-apply' if p.base == PRESENT else 'apply'} {patch_file(p.patch)}: it applies"
                         for p in state.patches
                         if p.regression == reg.id and p.head == APPLIES), "no patch of ours applies: fix it first")
            return f"{reg.id} is {how} at head (its symptom on {reg.symptom} of {reg.affected} cases); {step}"
    return None


def _incomplete(state: ReviewState) -> str | None:
    return state.missing or None


def _kernels_differ(state: ReviewState) -> str | None:
    unknown = "?" in (state.base.kernels, state.head.kernels)  # a tree that did not load names no kernels
    if unknown or state.base.kernels == state.head.kernels or not counted(state):
        return None
    n = sum(g.cases for g in counted(state))
    return f"{_plural(n, 'changed case')}, and base and head computed kernels with different code (head: " \
           f"{state.head.kernels})"


def _changed_failures(state: ReviewState) -> str | None:
    groups = counted(state)
    if not groups:
        return None
    parts = []
    for change, one, many in ((NEW, "new failure", "new failures"), (CHANGED, "changed failure", "changed failures"),
                              (STOPPED, "case no longer run", "cases no longer run")):
        mine = [g for g in groups if g.change == change]
        if mine:
            n = sum(g.cases for g in mine)
            parts.append(f"{n} {one if n == 1 else many} in {_plural(len(mine), 'signature')}")
    top = max(groups, key=lambda g: g.cases)
    return f"{', '.join(parts)} (top: {top.signature})"


def _kernels_failed(state: ReviewState) -> str | None:
    """Cases a fork's own kernel module failed at head that passed or failed otherwise at base:
    not the sync's regressions, but cases the review could not judge there."""
    mine = [g for g in state.signatures if g.provider and g.change in (NEW, CHANGED)]
    if not mine:
        return None
    top = max(mine, key=lambda g: g.cases)
    return (f"{_plural(sum(g.cases for g in mine), 'case')} failed in head's own kernels ({top.provider}), not"
            f" judged: {top.signature.rpartition(']: ')[2] or top.signature}")


def _other(state: ReviewState) -> str | None:
    if not state.other:
        return None
    return state.other[0] + (f" (and {len(state.other) - 1} more)" if len(state.other) > 1 else "")


def _merge(state: ReviewState) -> str | None:
    drops = sorted({patch_file(p.patch) for p in state.patches if patch_advice(p, _regression(state, p.regression))[0] == "drop"})
    return "no regression at head" + (f"; drop {', '.join(drops)}: upstream's fix is present" if drops else "")


RULES: tuple[Rule, ...] = (
    Rule("head_does_not_load", "head does not load, base does", Outcome.DO_NOT_MERGE, _head_does_not_load),
    Rule("nothing_judged", "a side judged no case (neither tree loads, or none of a side's cases was judged)",
         Outcome.CANNOT_JUDGE, _nothing_judged),
    Rule("fix_lost", "a patch that applies at base (or is in its tree) conflicts or is stale at head, upstream's fix"
         " is not recognised there and head does not pass the regression's cases", Outcome.DO_NOT_MERGE, _fix_lost),
    Rule("bug_back", "a regression fixed at base (or that base predates) shows its symptom at head",
         Outcome.DO_NOT_MERGE, _bug_back),
    Rule("incomplete", "results are missing or were refused", Outcome.CANNOT_JUDGE, _incomplete),
    Rule("kernels_differ", "new or changed failures, or lost coverage, while base and head computed kernels with"
         " different code", Outcome.NEEDS_A_LOOK, _kernels_differ),
    Rule("changed_failures", "a new or changed failure signature, or lost coverage (not accepted), not raised in a"
         " fork's kernel provider", Outcome.NEEDS_A_LOOK, _changed_failures),
    Rule("kernels_failed", "cases that base judged fail at head inside a fork's own kernel module (counted apart,"
         " never as the sync's or the backport's failures)", Outcome.NEEDS_A_LOOK, _kernels_failed),
    Rule("other", "an unmet declared expectation, a target problem at head, a regression judged at base and not at"
         " head, or upstream's tests failing anew", Outcome.NEEDS_A_LOOK, _other),
    Rule("merge", "otherwise (standing failures, also a fork's kernel module's, are listed on one line, never failing)",
         Outcome.MERGE, _merge),
)


def headline(outcome: Outcome, detail: str, limit: int = HEADLINE_LIMIT) -> str:
    """The first line: its symbol, its word and the deciding reason, cut to `limit` characters."""
    word = f"PASS — {outcome.value}" if outcome is Outcome.MERGE else outcome.value
    text = f"{SYMBOL[outcome]} {word}: {' '.join(detail.split())}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decide(state: ReviewState) -> Decision:
    """The review's outcome: the first rule of RULES that matches, with every matching rule's reason."""
    matched = [(rule, text) for rule in RULES if (text := rule.detail(state)) is not None]
    rule, text = matched[0]  # "merge" always matches
    reasons = tuple(t for r, t in matched if r.outcome is not Outcome.MERGE)
    return Decision(rule.name, rule.outcome, headline(rule.outcome, text), reasons, standing_line(state))


def patch_advice(patch: PatchState, reg: RegressionState | None) -> tuple[str, str]:
    """One patch's action at head and the advice in words, stated once for every output."""
    name, where = patch.patch, f" ({patch.where})" if patch.where else ""
    head = reg.head if reg else UNJUDGED
    if head == PREDATES:
        return "not needed", f"not needed: head predates {patch.regression}"
    if patch.head_fix and patch.head != APPLIES:
        return "drop", f"drop {name}: upstream's fix is present at head"
    if head == FIXED_UPSTREAM and patch.head != APPLIES:  # a release outside the affected ones, cases passing
        return "drop", f"drop {name}: head is fixed upstream and passes every affected case"
    if patch.head_fix:
        return "check by hand", f"{name} still applies though upstream's fix is present: check by hand, then drop it"
    if patch.head == PRESENT:
        return "keep", f"keep {name}: it is in head's tree and upstream's fix is not"
    if patch.head == APPLIES and head in (FIXED, FIXED_UPSTREAM):
        return "check by hand", (f"{name} applies, yet head passes every affected case without it: look, then add"
                                 f" a marker to its .toml or drop it")
    if patch.head == APPLIES and patch.base == PRESENT:  # the fork had it in its tree; the sync lost it
        return "re-apply", f"re-apply {name}: it applies and head still needs it"
    if patch.head == APPLIES:
        return "apply", f"apply {name}: it applies and head still needs it"
    if head in (FIXED, FIXED_UPSTREAM):
        return "check by hand", (f"{name} no longer applies{where}, yet head passes every affected case: the fix may"
                                 f" be there in a form no marker knows; look, then add a marker or drop it")
    return "port", f"port {name}: it no longer applies{where} and {patch.regression} is not fixed at head"


def rules_markdown() -> str:
    """The table as the README shows it."""
    rows = [f"| {n} | `{r.name}` | {r.when} | {SYMBOL[r.outcome]} {r.outcome.value} | {int(r.outcome is not Outcome.MERGE)} |"
            for n, r in enumerate(RULES, 1)]
    return "\n".join(["| # | rule | when | outcome | exit |", "|---|---|---|---|---|", *rows])
