"""A fork's own configuration: `.te-repro.toml` at its tree root, or `--fork-config FILE`.

A vendor fork may declare, in TOML:

    [standins."transformer_engine.pytorch.fp8"]   # extra stand-in symbols, by module
    npu_fp8_available = "false"                   # none | false | true | noop | class

    [[fixes.issue22]]                             # its own fix markers, per regression id
    file = "transformer_engine/pytorch/ops/fuser.py"
    pattern = "npu_guard_requires_grad"
    means = "the fork's own guard around requires_grad_"

    [renamed_ops]                                 # our op name -> "module:Class" or "Class" in ops/basic/
    AddExtraInput = "add_extra_input_npu:AddExtraInputNPU"

    [expect]                                      # what the tree must be, per regression id
    issue22 = "fixed"                             # or "affected"; decides the target's role

    version = "2.13.0"                            # the tree's version, where it has no version file
                                                  # (top level, before any table)

Stand-ins never replace the target's real modules: a symbol may be added to a module the
CPU backend already stands in, or to a module neither the target nor the environment has.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from harness.errors import UsageError
from harness.targets.cpu_backend.boundary import EXTENSION, PACKAGE
from harness.targets.patching import NAME, parse_markers, read_toml

TREE_FILE = ".te-repro.toml"
SymbolKind = Literal["none", "false", "true", "noop", "class"]
Expectation = Literal["fixed", "affected"]


class ForkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    standins: dict[str, dict[str, SymbolKind]] = {}
    fixes: dict[str, Any] = {}
    renamed_ops: dict[str, str] = {}
    expect: dict[str, Expectation] = {}
    version: str | None = None  # for a tree without build_tools/VERSION.txt (Megatron reads TE's version)

    @field_validator("version")
    @classmethod
    def _release_version(cls, value: str | None) -> str | None:
        from packaging.version import InvalidVersion, Version

        try:
            return None if value is None else str(Version(value))
        except InvalidVersion:
            raise ValueError(f"{value!r} is not a version (write e.g. \"2.13.0\")") from None

    @field_validator("standins")
    @classmethod
    def _module_names(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for module, symbols in value.items():
            if not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", module):
                raise ValueError(f"{module!r} is not a module name")
            # Never stood in: the tree's own package, nor the backend's extension under any of its
            # names (a fork's build may call it transformer_engine_torch_npu), as the loader counts it.
            if module == PACKAGE or module.startswith(EXTENSION):
                what = "the tree's own package" if module == PACKAGE else "the backend's extension"
                raise ValueError(f"{module!r} is {what}, never stood in; stand in only for a module neither "
                                 "the tree nor the environment has (e.g. a transformer_engine submodule the "
                                 "tree does not ship, or a vendor's platform module)")
            for symbol in symbols:
                if not symbol.isidentifier() or symbol.startswith("__"):
                    raise ValueError(f"{symbol!r} is not a symbol a stand-in may answer")
        return value

    @field_validator("renamed_ops")
    @classmethod
    def _op_names(cls, value: dict[str, str]) -> dict[str, str]:
        for ours, theirs in value.items():
            if not re.fullmatch(r"(?:[A-Za-z_]\w*:)?[A-Za-z_]\w*", theirs):
                raise ValueError(f"renamed op {ours} = {theirs!r}: write \"module:Class\" or \"Class\"")
        return value


def find(root: Path, explicit: str | None) -> Path | None:
    """The fork config that applies to a tree: the explicit file, else the tree's own."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise UsageError(f"--fork-config {explicit}: no such file; give a TOML file (see README, Fork config)")
        return path.resolve()
    own = root / TREE_FILE
    return own if own.is_file() else None


def load(path: Path) -> tuple[ForkConfig, dict[str, list[dict[str, str]]]]:
    """The validated config, and its fix markers as regression id -> [{file, pattern, means}]."""
    raw = read_toml(path, "fork config")
    try:
        config = ForkConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"fork config {path}: {where}: {first['msg']}") from None
    markers: dict[str, list[dict[str, str]]] = {}
    for regression, raw_markers in config.fixes.items():
        if not re.fullmatch(NAME, regression):
            raise UsageError(f"fork config {path}: fixes.{regression}: not a regression id")
        parsed = parse_markers(raw_markers, f"fork config {path}: fixes.{regression}")
        markers[regression] = [{"file": m.file, "pattern": m.pattern, "means": m.means} for m in parsed]
    from cases.regressions import REGRESSIONS  # here: the catalogue is needed only to check [expect]

    for regression in config.expect:
        if regression not in REGRESSIONS:
            raise UsageError(f"fork config {path}: expect.{regression}: unknown regression; valid: "
                             f"{', '.join(REGRESSIONS)}")
    return config, markers
