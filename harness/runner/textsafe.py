"""Values made safe to send and store, and to show: a record crosses xdist's channel (UTF-8 only) and
goes into results.jsonl, run.json and every report, whatever a target put in it.

Strings that are not valid UTF-8 (lone surrogates, from bytes decoded with
`surrogateescape`) become backslash escapes; a string over `TEXT_LIMIT` characters is cut,
with its full size noted; anything that is not JSON's own type becomes its repr. `printable` is for showing run
text (reports, the terminal): control characters become visible escapes.
"""

from __future__ import annotations

import re
from typing import Any

from harness.errors import UsageError

TEXT_LIMIT = 64 * 1024  # characters per string: a 10 MB message would otherwise go into every report whole
NOTE_ROOM = 100


def safe_text(text: str, limit: int = TEXT_LIMIT) -> str:
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit + NOTE_ROOM:  # the room: a text cut once is not cut again when read back
        text = f"{text[:limit]}… [truncated: {len(text)} characters in all]"
    return text


def safe_value(value: Any, keep_bytes: bool = False) -> Any:
    """`value` with every string made safe (recursively through dicts and lists); `keep_bytes`:
    bytes stay bytes (a worker's raw observation, whose tensors travel as bytes), else their repr."""
    if isinstance(value, str):
        return safe_text(value)
    if value is None or isinstance(value, (bool, int, float)) or (keep_bytes and isinstance(value, bytes)):
        return value
    if isinstance(value, dict):
        return {safe_text(str(k)): safe_value(v, keep_bytes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_value(v, keep_bytes) for v in value]
    return safe_text(repr(value))


# C0 controls but tab and newline, DEL, C1 controls (ESC and CSI/OSC start sequences among them), and the
# bidirectional overrides that reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# In a path, a newline or tab too: a path travels on one line (session files, the terminal, reports).
_PATH_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def check_path_text(path: str, what: str) -> None:
    """Refuse a path holding a control character, in one line that shows it escaped."""
    if found := _PATH_CONTROL.search(path):
        raise UsageError(f"{what} {path!a} holds the control character {found.group()!a}; "
                         "give a path without control characters (rename or link the directory)")


# How json.dumps (ASCII, its default) writes a character that _CONTROL matches. A literal backslash
# before such a letter matches too: that costs the full pass, never a missed escape.
_ENCODED_CONTROL = re.compile(r"\\(?:[bfr]|u00[01][0-9a-f]|u007f|u00[89][0-9a-f]|u202[a-e]|u206[6-9])")


def printable(value: Any, encoded: str | None = None) -> Any:
    """`value` with every control character in its strings shown as an escape (`\\x1b`): run
    text (a target's messages, a fork's paths) can neither drive a terminal nor break a page.
    `encoded`: this very value's JSON text with json.dumps' ASCII escapes (run.json's), where
    the caller has it; a value whose text holds no control character is returned as it is,
    without a pass over it."""
    if encoded is not None and not _ENCODED_CONTROL.search(encoded):
        return value
    if isinstance(value, str):
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value
