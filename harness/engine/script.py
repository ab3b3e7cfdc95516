"""Standalone reproduction scripts: one Python file per (case, target).

The script goes through the same loader and judge as a run (targets.prepare,
loader.load, execute.run_case), so what it prints is what the run recorded.

The template has exactly two tokens, each replaced by a JSON string literal (which is
also a valid Python literal). The HTML report embeds the template once and fills it
in the browser the same way, so it needs no script per case.
"""

from __future__ import annotations

import json

from cases.case import Case
from harness.errors import UsageError
from harness.targets import parse_spec

CASE_TOKEN = "__CASE_ID__"
TARGET_TOKEN = "__TARGET__"
DEFAULT_TARGET = "te-2.13.0"  # the unpatched release of issue 22

TEMPLATE = '''\
#!/usr/bin/env python3
"""Reproduce one te-fuser-repro case on one target (CASE_ID and TARGET below).

Written by `repro show CASE_ID --target TARGET --script`. Needs te-fuser-repro installed
(`pip install -e .` in its checkout); fetches the target into the usual cache
($TE_REPRO_CACHE, else the XDG cache dir). Prints the outcome a run records for this
case; exit status 0 when it passes, 1 otherwise (so `git bisect run` can use it).
"""

import sys

CASE_ID = __CASE_ID__
TARGET = __TARGET__


def main() -> int:
    from cases.case import Case
    from cases.matrix import exclusion
    from cases.regressions import REGRESSIONS
    from harness import targets
    from harness.runner import records
    from harness.runner.roles import role_of
    from harness.targets import sources
    from harness.targets.loader import load

    case = Case.from_id(CASE_ID)
    regression = REGRESSIONS[case.regression]
    reason = exclusion(case)
    if reason:
        print(f"case {CASE_ID} is not a valid case ({reason})")
        return 0
    prepared = targets.prepare(TARGET, sources.cache_dir())
    role, why = role_of(regression, prepared)
    result = records.judge(case, TARGET, load(prepared), role)
    print(f"case {CASE_ID} on {TARGET} (fuser.py {prepared.fuser_sha}, patch {prepared.patch_status})")
    print(f"role: {role} ({why})")
    print(f"outcome: {result['outcome']}   verdict: {result['verdict']} ({result['verdict_reason']})")
    print(f"predicted: {result['predicted'] or 'no failure'}")
    error = result["error"]
    if error:
        print(f"error: {error['type']} at {error['location'] or '(no TE frame)'}: {error['message']}")
        print(error.get("traceback") or "", end="")
    for check, lines in result["details"].items():
        for line in lines:
            print(f"failed check {check}: {line}")
    for line in result["known_deviations"]:
        print(f"known deviation: {line}")
    return 0 if result["outcome"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def parse_case_id(case_id: str) -> Case:
    """The Case a case id names; UsageError (one line) for anything else."""
    from cases.regressions import REGRESSIONS

    regression = case_id.partition(":")[0]
    if ":" in case_id and regression not in REGRESSIONS:
        raise UsageError(f"bad case id {case_id!r}: unknown regression {regression!r}; "
                         f"valid: {', '.join(REGRESSIONS)}")
    axes = REGRESSIONS[regression].axes if regression in REGRESSIONS else REGRESSIONS["issue22"].axes
    form = f"{regression if regression in REGRESSIONS else 'REGRESSION'}:{'-'.join(axes)}"
    try:
        case = Case.from_id(case_id)
    except ValueError:
        raise UsageError(f"bad case id {case_id!r}: expected {form}") from None
    for axis, values in axes.items():
        if getattr(case, axis) not in values:
            raise UsageError(f"bad case id {case_id!r}: unknown {axis} {getattr(case, axis)!r}; "
                             f"valid: {', '.join(values)}")
    return case


def _literal(text: str) -> str:
    # What JSON.stringify gives in the HTML report; a valid Python string literal too.
    return json.dumps(text, ensure_ascii=False)


def render_script(case_id: str, target: str = DEFAULT_TARGET) -> str:
    parse_case_id(case_id)
    parse_spec(target)  # UsageError on a bad spec
    return TEMPLATE.replace(CASE_TOKEN, _literal(case_id)).replace(TARGET_TOKEN, _literal(target))
