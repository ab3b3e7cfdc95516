"""One case: a regression id and one value per axis of that regression. Its id is built
from those values, in the regression's axis order, so it is stable without enumerating
the combinations that cannot run. Each regression has its own axes (cases/regression.py);
an axis it does not vary is not in its case ids."""

from __future__ import annotations

from typing import Any

# Each catalogue regression's axes, in id order, registered as the regression is declared
# (cases/regression.py), so that a Case needs no import of the catalogue that is built from Cases.
_AXES_OF: dict[str, tuple[str, ...]] = {}


def register_axes(regression: str, axes: tuple[str, ...]) -> None:
    """The first declaration of a regression id names its axes (a test's toy of the same id cannot replace them)."""
    _AXES_OF.setdefault(regression, axes)


def axis_names(regression: str) -> tuple[str, ...] | None:
    """The axes of a known regression, in id order; None for an unknown one."""
    return _AXES_OF.get(regression)


class Case:
    """A regression id and its axis values; `case.pipeline` reads the axis `pipeline`.

    Built positionally (`Case("issue22", "ops", ...)`, the regression's axis order) or by
    name (`Case("issue22", client="ops", ...)`, reordered into the regression's order)."""

    __slots__ = ("_id", "regression", "values")
    regression: str
    values: tuple[tuple[str, str], ...]
    _id: str | None  # the case id, once asked for: the run asks it of every case many times over

    def __init__(self, regression: str, *positional: str, **named: str) -> None:
        axes = axis_names(regression)
        if positional:
            if named or axes is None or len(positional) != len(axes):
                raise TypeError(f"case of {regression}: {len(positional)} values for axes {axes}")
            values = tuple(zip(axes, positional))
        elif axes is not None:
            if set(named) != set(axes):
                raise TypeError(f"case of {regression}: axes {sorted(named)}, expected {list(axes)}")
            values = tuple((axis, named[axis]) for axis in axes)
        else:
            values = tuple(named.items())
        object.__setattr__(self, "regression", regression)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "_id", None)

    def __getattr__(self, name: str) -> str:
        if name.startswith("__") or name in Case.__slots__:
            raise AttributeError(name)
        for axis, value in self.values:
            if axis == name:
                return value
        raise AttributeError(f"case {self.case_id} has no axis {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Case is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Case) and (self.regression, self.values) == (other.regression, other.values)

    def __hash__(self) -> int:
        return hash((self.regression, self.values))

    def __repr__(self) -> str:
        return f"Case({self.case_id!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.regression, self.values))

    def get(self, axis: str, default: str | None = None) -> str | None:
        """The axis value, or `default` when the regression does not vary that axis."""
        return dict(self.values).get(axis, default)

    @property
    def case_id(self) -> str:
        case_id = self._id
        if case_id is None:
            case_id = id_of(self.as_dict())
            object.__setattr__(self, "_id", case_id)
        return case_id

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """The inverse of `case_id`; ValueError when it is not one of a known regression."""
        regression, sep, values = case_id.partition(":")
        axes = axis_names(regression)
        parts = values.split("-")
        if not sep or axes is None or len(parts) != len(axes):
            raise ValueError(f"not a case id: {case_id!r}")
        return cls(regression, *parts)

    def axes(self) -> dict[str, str]:
        return dict(self.values)

    def as_dict(self) -> dict[str, str]:
        return {"regression": self.regression, **dict(self.values)}


def id_of(fields: dict[str, str]) -> str:
    """The id of the case whose `as_dict()` these fields are, in their order; needs no catalogue
    (a session's controller reads its case file with it, without importing torch)."""
    return f"{fields['regression']}:" + "-".join(value for axis, value in fields.items() if axis != "regression")


def _restore(regression: str, values: tuple[tuple[str, str], ...]) -> Case:
    return Case(regression, **dict(values))
