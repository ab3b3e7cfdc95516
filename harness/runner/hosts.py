"""Workers on other hosts: pytest-xdist's own `--tx` specs, checked before a run starts.

`repro run --tx 2*popen --tx ssh=HOST//python=PY` hands the specs to each target's
pytest session (harness.runner.sessions). A spec is execnet's: `[N*]` then `popen`,
`ssh=HOST`, `socket=HOST:PORT` or `vagrant_ssh=NAME`, with `//key=value` options
(`python=`, `chdir=`, `ssh_config=`, `env:NAME=`).
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UsageError

GATEWAYS = ("popen", "ssh", "socket", "vagrant_ssh")
VALID = "[N*]popen|ssh=HOST|socket=HOST:PORT|vagrant_ssh=NAME[//python=PY][//chdir=DIR][//ssh_config=FILE]"


def check_tx(specs: list[str] | None) -> list[str] | None:
    """The specs, unchanged, or a UsageError naming the first bad one and what is valid."""
    if not specs:
        return None
    for spec in specs:
        count, star, rest = spec.partition("*")
        if not star:
            count, rest = "1", spec
        gateway = rest.split("//")[0].split("=")[0]
        if not count.isdigit() or int(count) < 1 or gateway not in GATEWAYS or (gateway != "popen" and "=" not in
                                                                                   rest.split("//")[0]):
            raise UsageError(f"--tx {spec!r} is not an xdist spec; valid: {VALID}")
    return specs


def check_rsyncdirs(dirs: list[str] | None) -> list[str] | None:
    """Directories xdist copies to remote workers; each must exist here."""
    for path in dirs or []:
        if not Path(path).is_dir():
            raise UsageError(f"--rsyncdir {path}: no such directory; give a directory to copy to the remote workers")
    return [str(Path(p).resolve()) for p in dirs] if dirs else None
