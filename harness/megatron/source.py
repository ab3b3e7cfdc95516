"""Where Megatron's source comes from: a megatron-core release wheel in the cache, or a checkout.

`--megatron VERSION` fetches that release of `megatron-core` with `pip download --no-deps`.
Releases from 0.17 on are published for CPython 3.12 only; the modules the harness runs are
pure Python and run on 3.11, so the wheel is asked for with 3.12's tags, and only its files
are used (nothing is installed). The fetch and the unpack are the TE wheels' own
(harness/targets/sources.py): a per-version lock, a zip-slip check, an atomic rename, a damaged
wheel fetched again, and the unpacked tree checked against the wheel's RECORD on every use.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.targets.sources import Distribution, fetch_wheel, unpack_wheel, wheel_version

MEGATRON_ENV = "TE_REPRO_MEGATRON"  # a PreparedMegatron as JSON, handed to worker processes

PACKAGE = "megatron-core"
DEFAULT_VERSION = "0.19.0"
MARKER = Path("megatron/core/extensions/transformer_engine.py")  # the file the bug report's frames pass through
# The tags of the wheels 0.17+ publish; the Python code is the same for every tag.
WHEEL_TAGS = ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
              "--platform", "manylinux_2_28_x86_64")
MEGATRON = Distribution(PACKAGE, MARKER, "a megatron-core release with TE extensions", WHEEL_TAGS)
VERSION = r"\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?"
SPEC_FORMS = "a megatron-core version (e.g. 0.19.0) or path:<dir holding megatron/core>"


@dataclass(frozen=True)
class PreparedMegatron:
    """What a worker needs to import Megatron; JSON-serialisable, and recorded in run.json."""

    spec: str
    version: str
    source: str  # the wheel's file name, or the checkout's directory
    root: str  # the directory holding megatron/

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PreparedMegatron:
        return cls(**json.loads(text))


def _checkout_version(root: Path) -> str:
    """A checkout's version, from Megatron's own package_info.py (read, not imported)."""
    info = root / "megatron/core/package_info.py"
    text = info.read_text() if info.is_file() else ""
    parts = dict(re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([^'\"\s#]*)", text, re.MULTILINE))
    if not {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        return "unknown"
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def check_megatron_spec(spec: str) -> None:
    """The spec's form, without fetching anything; UsageError (one line) when it has none."""
    if not (spec.startswith("path:") and len(spec) > 5) and not re.fullmatch(VERSION, spec):
        raise UsageError(f"unknown Megatron spec {spec!r}; valid: {SPEC_FORMS}")


def prepare_megatron(spec: str, cache: Path, offline: bool = False) -> PreparedMegatron:
    """Fetch and unpack (or check) a Megatron source. Raises UsageError for bad input."""
    check_megatron_spec(spec)
    if spec.startswith("path:"):
        root = Path(spec[5:]).expanduser().resolve()
        if (root / "core").is_dir() and root.name == "megatron":
            root = root.parent
        if not (root / MARKER).is_file():
            raise UsageError(f"{spec} is not a Megatron checkout: it has no {MARKER}; valid: {SPEC_FORMS}")
        return PreparedMegatron(spec, _checkout_version(root), str(root), str(root))
    wheel = fetch_wheel(spec, cache, offline, MEGATRON)
    root = unpack_wheel(wheel, cache, f"megatron-core-{spec}", MEGATRON)
    return PreparedMegatron(spec, wheel_version(root, MEGATRON), wheel.name, str(root))
