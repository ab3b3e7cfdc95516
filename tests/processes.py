"""What the tests ask of /proc about the processes a run leaves."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Running, or stopped: anything but gone or a zombie (ended, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
