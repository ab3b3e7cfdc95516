"""Values made safe to send and store: a record crosses xdist's channel (UTF-8 only) and
goes into results.jsonl, run.json and every report, whatever a target put in it.

Strings that are not valid UTF-8 (lone surrogates, from bytes decoded with
`surrogateescape`) become backslash escapes; a string over `TEXT_LIMIT` characters is cut,
with its full size noted; anything that is not JSON's own type becomes its repr.
"""

from __future__ import annotations

from typing import Any

TEXT_LIMIT = 64 * 1024  # characters per string: a 10 MB message would otherwise go into every report whole
NOTE_ROOM = 100


def safe_text(text: str, limit: int = TEXT_LIMIT) -> str:
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit + NOTE_ROOM:  # the room: a text cut once is not cut again when read back
        text = f"{text[:limit]}… [truncated: {len(text)} characters in all]"
    return text


def safe_value(value: Any) -> Any:
    """`value` with every string made safe (recursively through dicts and lists)."""
    if isinstance(value, str):
        return safe_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, dict):
        return {safe_text(str(k)): safe_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_value(v) for v in value]
    return safe_text(repr(value))
