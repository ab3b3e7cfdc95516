"""One case: a regression id and one value per axis. Its id is built from those values,
so it is stable without enumerating the combinations that cannot run."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cases.axes import AXES


@dataclass(frozen=True)
class Case:
    regression: str
    client: str
    pipeline: str
    grad_mode: str
    input: str
    params: str
    recompute: str
    sequence: str
    grad_form: str
    dtype: str
    device: str

    @property
    def case_id(self) -> str:
        return f"{self.regression}:" + "-".join(getattr(self, axis) for axis in AXES)

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """The inverse of `case_id`; ValueError when it is not one."""
        regression, sep, values = case_id.partition(":")
        parts = values.split("-")
        if not sep or len(parts) != len(AXES):
            raise ValueError(f"not a case id: {case_id!r}")
        return cls(regression, *parts)

    def axes(self) -> dict[str, str]:
        return {axis: getattr(self, axis) for axis in AXES}

    def as_dict(self) -> dict[str, str]:
        return asdict(self)
