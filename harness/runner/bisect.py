"""The search behind `repro bisect`: among the commits from a good end to a bad end, the
first one at which the chosen cases' state differs from their state at the good end, in
about log2(N) judgements. A commit that cannot be judged (its tree does not load, its cases
are not applicable) is skipped, as `git bisect skip` does, and the answer is then one of K
commits.

A case's state is its signature (harness/runner/signature.py).

Pure: the caller's `judge(commit)` runs the cases and returns their signatures; this module
only compares and picks the next commit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.runner.signature import Signature, error_file, signature, signature_text

__all__ = ["Signature", "error_file", "signature", "signature_text"]

Judged = Mapping[str, Signature | None]  # case id -> signature; None: that case cannot be judged there
State = dict[str, Signature]
Judge = Callable[[str], Judged | None]  # None: nothing could be judged at that commit



def signatures(records: Iterable[Mapping[str, Any]]) -> dict[str, Signature | None]:
    return {r["case_id"]: signature(r) for r in records}


def describe(state: Mapping[str, Signature]) -> list[str]:
    """The state as "N cases: SIGNATURE" lines, the commonest first."""
    counts = Counter(state.values())
    return [f"{n} case{'s' if n != 1 else ''}: {signature_text(sig)}"
            for sig, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def changed_cases(before: Mapping[str, Signature], after: Mapping[str, Signature]) -> list[str]:
    return sorted(case for case in before if before[case] != after.get(case))


@dataclass(frozen=True)
class Step:
    commit: str
    role: str  # "good end", "bad end", "merge base" or "step"
    state: str  # "good" (the good end's state), "changed" (another), "skipped" (not judged)
    why: str = ""  # for a skipped commit: what could not be judged


@dataclass
class Answer:
    culprits: list[str]  # one commit: the answer; more: one of these (the skipped ones, then the first changed)
    last_good: str  # the last commit judged with the good end's state
    before: State  # the good end's state (at last_good)
    after: State  # the state at culprits[-1]
    bad_state: State
    bad_commit: str
    cases: list[str]  # the cases compared: judged at both ends
    dropped: list[str]  # cases left out: not judged at one end
    steps: list[Step] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return len(self.culprits) == 1


class NoAnswer(Exception):
    """The search cannot start or end (an end not judged, both ends alike, a merge base unlike good)."""

    def __init__(self, reason: str, steps: list[Step]) -> None:
        super().__init__(reason)
        self.steps = steps


def _restrict(judged: Judged | None, cases: Sequence[str]) -> tuple[State | None, str]:
    """The state of `cases` at a commit, or None and why when one of them is not judged there."""
    if judged is None:
        return None, "nothing could be judged (the tree does not load)"
    missing = [c for c in cases if judged.get(c) is None]
    if missing:
        return None, f"{len(missing)} of {len(cases)} cases not judged (not applicable, harness error or missing)"
    return {c: sig for c in cases if (sig := judged.get(c)) is not None}, ""


def bisect(good: str, commits: Sequence[str], judge: Judge, base: str | None = None,
           on_step: Callable[[Step], None] | None = None) -> Answer:
    """`commits`: the commits after the good end (or after `base`, good's merge base with the
    bad end when good is not its ancestor), oldest first, the bad end last."""
    if not commits:
        raise NoAnswer("no commit lies between the good and the bad end", [])
    steps: list[Step] = []

    def record(step: Step) -> None:
        steps.append(step)
        if on_step is not None:
            on_step(step)

    bad = commits[-1]
    good_judged, bad_judged = judge(good), judge(bad)
    both = [c for c in (good_judged or {}) if (good_judged or {}).get(c) and (bad_judged or {}).get(c)]
    dropped = sorted((set(good_judged or {}) | set(bad_judged or {})) - set(both))
    for commit, role, judged in ((good, "good end", good_judged), (bad, "bad end", bad_judged)):
        whole = {c: s for c, s in (judged or {}).items() if s is not None}
        record(Step(commit, role, "good" if role == "good end" else "changed", "" if whole else "nothing judged"))
        if not whole:
            raise NoAnswer(f"the {role} ({commit[:12]}) cannot be judged: none of the cases ran there (a tree that"
                           " does not load, or cases not applicable)", steps)
    if not both:
        raise NoAnswer("no case is judged at both ends (each is not applicable or a harness error at one end)", steps)
    good_state, _ = _restrict(good_judged, both)
    bad_state, _ = _restrict(bad_judged, both)
    assert good_state is not None and bad_state is not None
    if good_state == bad_state:
        cases = f"the {len(both)} cases have" if len(both) != 1 else "the case has"
        raise NoAnswer(f"{cases} the same state at both ends ({'; '.join(describe(good_state))}): nothing to bisect",
                       steps)
    last_good = good
    if base is not None:
        base_state, why = _restrict(judge(base), both)
        record(Step(base, "merge base", "skipped" if base_state is None else
                    "good" if base_state == good_state else "changed", why))
        if base_state != good_state:
            said = why if base_state is None else "; ".join(describe(base_state))
            raise NoAnswer(f"the good end is not an ancestor of the bad end, and their merge base {base[:12]} does not"
                           f" have the good end's state ({said}): the change is not on the bad end's side alone;"
                           f" bisect from --good ...@{base[:12]} instead", steps)
        last_good = base
    lo, hi = -1, len(commits) - 1
    states: dict[int, State] = {hi: bad_state}
    skipped: set[int] = set()
    while untried := [i for i in range(lo + 1, hi) if i not in skipped]:
        middle = (lo + hi) / 2
        index = min(untried, key=lambda i: (abs(i - middle), i))
        state, why = _restrict(judge(commits[index]), both)
        if state is None:
            skipped.add(index)
            record(Step(commits[index], "step", "skipped", why))
        elif state == good_state:
            lo = index
            record(Step(commits[index], "step", "good"))
        else:
            hi, states[index] = index, state
            record(Step(commits[index], "step", "changed"))
    culprits = [commits[i] for i in range(lo + 1, hi) if i in skipped] + [commits[hi]]
    return Answer(culprits, commits[lo] if lo >= 0 else last_good, good_state, states[hi], bad_state, bad, both,
                  dropped, steps)
