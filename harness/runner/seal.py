"""Records sealed by the run: only a line the run's own processes wrote counts.

A worker imports the target, and a target can write anywhere its user can: it can read the
results file's path from its parent's command line and append records of its own. So each
record that a session's controller (or the runner) writes carries an HMAC under a key made
for the run, and the runner counts only the lines whose seal holds. The key never travels in
an argument, the environment or a file: the runner hands it to each session's controller
through an inherited pipe, read and closed before any worker starts, so no worker holds it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from typing import Any

FIELD = "seal"
REJECTED = "rejected"  # a sealed line that names a record the controller refused, and why


def new_key() -> bytes:
    return secrets.token_bytes(32)


def _mac(record: dict[str, Any], key: bytes) -> str:
    return text_mac(json.dumps({k: v for k, v in record.items() if k != FIELD}, sort_keys=True, separators=(",", ":")),
                    key)


def text_mac(text: str, key: bytes) -> str:
    """The seal of a line's exact text (a line written and read back as text, never re-serialised)."""
    return hmac.new(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def sealed(record: dict[str, Any], key: bytes) -> dict[str, Any]:
    return {**record, FIELD: _mac(record, key)}


def holds(record: dict[str, Any], key: bytes) -> bool:
    return isinstance(record.get(FIELD), str) and hmac.compare_digest(record[FIELD], _mac(record, key))


def unsealed(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != FIELD}


def rejection(target: str, problem: str, key: bytes) -> dict[str, Any]:
    return sealed({REJECTED: problem, "target": target}, key)


def key_pipe(key: bytes) -> int:
    """The read end of a pipe that holds `key` and then ends: for a child to inherit and read once."""
    read_end, write_end = os.pipe()
    os.write(write_end, key.hex().encode())
    os.close(write_end)
    return read_end


def read_key(fd: int) -> bytes:
    """The key from an inherited pipe, which is closed after."""
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return bytes.fromhex(b"".join(chunks).decode())
