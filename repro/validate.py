"""Option checks shared by the commands, run before anything is written: each bad value
gives one line saying what was wrong and what is valid (exit status 2)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

from harness import targets
from harness.errors import UsageError
from harness.runner import rundir
from harness.runner.textsafe import check_path_text, printable
from harness.targets import sources


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {printable(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def common_options() -> OneLineParser:
    """The options every command takes (the target cache, offline), as a parent parser."""
    common = OneLineParser(add_help=False)
    common.add_argument("--cache-dir", help=f"target cache (default ${sources.CACHE_ENV} or the XDG cache dir)")
    common.add_argument("--offline", action="store_true", help="use only the cache; never download")
    common.add_argument("--no-sandbox", action="store_true",
                        help="run target code without the sandbox (its own namespaces, a read-only file system, "
                             "seccomp), with this user's full reach: only where the kernel refuses namespaces")
    return common


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 or more")
    return value


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(text: str) -> int:
    """`-n`: local workers, 1 or more and at most one per usable CPU (more only queue, each
    holding a whole target in memory); remote workers are `--tx`'s."""
    value = positive_int(text)
    if value > (cpus := usable_cpus()):
        raise argparse.ArgumentTypeError(f"{value} is more than the {cpus} CPUs this machine gives; "
                                         f"give 1 to {cpus} (--tx for workers elsewhere)")
    return value


MIN_RSS_GIB = 1.0  # a worker holds about 0.35 GiB once torch and TE are imported


def max_rss_bytes(text: str) -> int:
    """`--max-rss GIB`: the data a worker may hold, from 1 GiB to the machine's memory."""
    from harness.runner import memory

    gib = positive_float(text)
    most = memory.physical_memory() / memory.GIB
    if not MIN_RSS_GIB <= gib <= most:
        raise argparse.ArgumentTypeError(f"{text} GiB is not allowed; give {MIN_RSS_GIB:g} to {most:.1f} "
                                         "(this machine's memory)")
    return int(gib * memory.GIB)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give seconds above 0") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give seconds above 0")
    return value


MAX_TIMEOUT_S = 7 * 24 * 3600  # a week: far above any case, and well inside what setitimer and a monotonic clock take


def timeout_seconds(text: str) -> float:
    """A timeout: seconds above 0 and at most a week (larger values overflow the timers in every session)."""
    value = positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give seconds above 0, at most {MAX_TIMEOUT_S}")
    return value


def check_only(only: list[str] | None) -> None:
    """A repeated `--only` axis would silently keep the last; its values go in one option."""
    seen: set[str] = set()
    for item in only or []:
        axis = item.split("=", 1)[0].strip()
        if axis in seen:
            raise UsageError(f"--only {axis}= is given twice; give its values once, comma-separated "
                             f"(--only {axis}=A,B)")
        seen.add(axis)


def target_specs(listed: str | None, single: list[str] | None, default: tuple[str, ...] | None,
                 fork_config: str | None = None) -> list[str] | None:
    """The targets of `--targets A,B` and repeated `--target SPEC` (never split, so a path
    holding a comma can be named), each parsed and none repeated; the default when neither
    (None: each regression's own default targets). The options (`--fork-config` too) are
    checked before the targets' trees and wheels are looked at."""
    specs = (targets.parse_spec_list(listed) if listed is not None else []) + list(single or [])
    if not specs and default is None:
        check_fork_config(fork_config, [])
        return None
    specs = [targets.canonical_spec(spec) for spec in specs or list(default or ())]
    targets.check_unique(specs)
    check_fork_config(fork_config, specs)
    targets.check_available(specs)
    return specs


def check_out(out: Path, specs: list[str], cache: Path) -> None:
    """The check every writing command (run, report -o, bench, review, sweep) makes before it
    writes: its --out (a dir or a file) is neither inside a tree of `specs` (path:, installed)
    nor inside the cache, and it holds no control character. Specs that do not parse (an old
    run's) are skipped."""
    check_path_text(str(out), "output path")
    rundir.check_out_location(out, targets.source_roots([s for s in specs if _parses(s)]), cache)


def _parses(spec: str) -> bool:
    try:
        targets.parse_spec(spec)
    except UsageError:
        return False
    return True


def check_fork_config(path: str | None, specs: list[str]) -> None:
    """`--fork-config` must be a valid fork config, and some target must be a tree it applies to."""
    if path is None:
        return
    if not any(targets.parse_spec(spec).kind in ("path", "installed") for spec in specs):
        raise UsageError("--fork-config applies to path: and installed targets; none is among the targets")
    from harness.targets import forkconfig

    found = forkconfig.find(Path("."), path)
    if found is not None:
        forkconfig.load(found)
