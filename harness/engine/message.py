"""What a worker may send the judge: what it observed, never a field of a record.

The worker imports the target, so each message it sends may be the target's own choice. A
message is one of three kinds, each with the fields it may name, and nothing else:

- sides: the target's side of a case (`test`; an `unfused` side where it runs beside it, and a
  `reference` side that the judge reads only where the reference needs the target, Megatron's
  block's: harness.engine.reference), the `error` that ended it, the scenario's `label` and `note`, `duration_s`,
  the process state the case changed (`state_changes`), and `fields`: what the judge copies
  into the record as observed (the fused ops that ran, the device calls answered, a scenario's
  observations, a Megatron crash's frames);
- not run (`observed`): a case that could not run on the target (not applicable, a load or
  harness failure), with its note and error;
- lost (`lost`): a case that ended without an observation (a timeout, an exception that ends it).

Every other field of a record (outcome, verdict, failed checks, target, case id, axes,
expected, rule, role, ...) is the judge's own, computed outside the worker. A message that
names another field is refused: the judge records the case as a harness error that names the
fields, and the run lists the refusal among its rejected records, which fail it.
"""

from __future__ import annotations

from typing import Any

ERROR = frozenset({"type", "message", "location", "traceback"})
# What the judge copies into the record from a message of sides (harness.engine.compare).
FIELDS = frozenset({"fused_ops", "device_calls", "observations", "frames", "frame_table", "report_error"})
SIDES = frozenset({"test", "reference", "unfused", "error", "label", "note", "duration_s", "fields", "state_changes"})
# A case that did not run: what harness.runner.records._not_run makes, and the coverage gap beside it.
NOT_RUN = frozenset({"outcome", "failed_checks", "details", "error", "side_effects", "known_deviations", "note",
                     "duration_s", "coverage_gap"})
LOST = frozenset({"why", "text", "error_type"})
# Per kind (the key that marks it, None for sides): its own fields, and those of its nested mappings.
KINDS: dict[str | None, tuple[frozenset[str], dict[str, frozenset[str]]]] = {
    "lost": (frozenset({"lost"}), {"lost": LOST}),
    "observed": (frozenset({"observed", "state_changes"}), {"observed": NOT_RUN}),
    None: (SIDES, {"fields": FIELDS, "error": ERROR}),
}
NAME_LIMIT = 80  # characters of a refused name kept in the record: a worker picks the names


class MessageError(ValueError):
    """A message that is not one a worker may send (it imports no torch: the runner checks messages too)."""


class Refused(MessageError):
    """A message that names fields no worker may send."""


def kind(raw: dict[str, Any]) -> str | None:
    return "lost" if "lost" in raw else "observed" if "observed" in raw else None


def refused(raw: Any) -> list[str]:
    """The fields `raw` names that no worker may send, as dotted names (`fields.outcome`); none for a
    value that is not a mapping (the judge refuses that as no observation at all)."""
    if not isinstance(raw, dict):
        return []
    allowed, nested = KINDS[kind(raw)]
    found = [str(k) for k in raw if k not in allowed]
    for name, keys in nested.items():
        if isinstance(value := raw.get(name), dict):
            found += [f"{name}.{k}" for k in value if k not in keys]
    if isinstance(observed := raw.get("observed"), dict) and isinstance(error := observed.get("error"), dict):
        found += [f"observed.error.{k}" for k in error if k not in ERROR]
    return [name if len(name) <= NAME_LIMIT else name[:NAME_LIMIT] + "…" for name in found]


def refusal(names: list[str]) -> str:
    return f"it names fields no worker may send: {', '.join(names)} (a worker sends observations, never a record)"


def check(raw: Any) -> None:
    """Refuse a message that names a field no worker may send (Refused), or whose values the record
    takes are not of their kind (MessageError)."""
    if names := refused(raw):
        raise Refused(refusal(names))
    if not isinstance(raw, dict):
        return
    check_error(raw.get("error"), "error")
    for name, kinds in (("note", (str, type(None))), ("label", (str, type(None))), ("duration_s", (int, float)),
                        ("state_changes", (list,))):
        if name in raw and (not isinstance(raw[name], kinds) or isinstance(raw[name], bool)):
            raise MessageError(f"its {name} is {type(raw[name]).__name__}")
    fields_of(raw)


def check_error(error: Any, where: str) -> None:
    """An error the record takes as it is: None, or one with a type and a message (frames.error_record)."""
    if error is not None and not (isinstance(error, dict) and isinstance(error.get("type"), str)
                                  and isinstance(error.get("message"), str)):
        raise MessageError(f"its {where} is not an error record (type and message)")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


FIELD_KINDS = {"fused_ops": _strings, "device_calls": _strings, "observations": lambda v: isinstance(v, dict),
               "frames": lambda v: isinstance(v, list) and all(isinstance(f, dict) for f in v),
               "frame_table": lambda v: isinstance(v, list) and all(isinstance(f, dict) for f in v),
               "report_error": lambda v: isinstance(v, bool)}


def fields_of(raw: dict[str, Any]) -> dict[str, Any]:
    """The observed fields a message of sides brings for the record, each of its kind; Refused for a
    field that is not one of them."""
    fields = raw.get("fields")
    if fields is None:
        return {}
    if not isinstance(fields, dict):
        raise MessageError("its fields are not a mapping")
    if names := refused({"fields": fields}):
        raise Refused(refusal(names))
    if wrong := [k for k, v in fields.items() if not FIELD_KINDS[k](v)]:
        raise MessageError(f"its fields {', '.join(wrong)} are not of their kind")
    return dict(fields)
