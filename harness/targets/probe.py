"""Load one prepared target in this (fresh) process and report on it as JSON.

`repro targets` and `repro minimal` run this as a subprocess per target, because a
process can hold only one TE version.
"""

from __future__ import annotations

import json
import sys

from harness.errors import TargetLoadError
from harness.targets import PreparedTarget


def main() -> None:
    prepared = PreparedTarget.from_json(sys.argv[1])
    report: dict = {"load_error": None}
    try:
        from harness.targets.loader import load

        target = load(prepared)
        report["description"] = target.description
        if "--minimal" in sys.argv:
            from harness.engine.minimal import run_minimal

            report["minimal"] = run_minimal(target)
    except TargetLoadError as exc:
        report["load_error"] = str(exc)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
