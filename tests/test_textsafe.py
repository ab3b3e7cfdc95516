"""A run's text is escaped once, and its run.json encoded in one pass: the shortcuts give what the
full passes give."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from harness.runner.rundir import run_text
from harness.runner.textsafe import printable

# Text that often holds the characters printable escapes, and the backslashes json writes before them.
_TEXT = st.text(alphabet=st.sampled_from(["a", "\\", "b", "u", "0", "\t", "\n", "\x08", "\x0c", "\x0d", "\x1b", "\x7f",
                                           "\x85", "\u202e", "\u2066", "é"]) | st.characters(), max_size=12)
_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                       max_leaves=12)


@given(_VALUES)
def test_printable_from_the_encoded_text_is_the_full_pass(value: Any) -> None:
    assert printable(value, json.dumps(value)) == printable(value)


@given(st.dictionaries(_TEXT, _VALUES, max_size=4), st.lists(st.dictionaries(_TEXT, _VALUES, max_size=3), max_size=5))
def test_run_text_is_the_run_with_one_result_a_line(head: dict[str, Any], results: list[dict[str, Any]]) -> None:
    run = {**{k: v for k, v in head.items() if k != "results"}, "results": results}
    text = run_text(run)
    assert json.loads(text) == run
    lines = text.splitlines()
    first = lines.index(' "results": [') if results else None
    if first is not None:
        assert [json.loads(line.strip().rstrip(",")) for line in lines[first + 1:first + 1 + len(results)]] == results
