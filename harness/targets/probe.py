"""Load one prepared target in this (fresh) process and report on it as JSON.

`repro targets` and `repro minimal` run this as a subprocess per target, because a
process can hold only one TE version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    from harness.runner.textsafe import safe_value

    text = json.dumps(safe_value(report))
    if "--report" in sys.argv:  # the caller's own channel: nothing the target prints can mix into it
        Path(sys.argv[sys.argv.index("--report") + 1]).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
