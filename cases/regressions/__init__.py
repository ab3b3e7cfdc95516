"""The regression catalogue: every module in this package defines one `REGRESSION`.
Adding a regression adds a module here and its patch under patches/, nothing else. The
generated matrix (cases/generated_matrix.py) joins it, last."""

from __future__ import annotations

import importlib
import pkgutil

from cases.regression import Regression


def _discover() -> dict[str, Regression]:
    found: dict[str, Regression] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        regression = importlib.import_module(f"{__name__}.{info.name}").REGRESSION
        found[regression.id] = regression
    # The generated matrix is no regression, but runs, reviews and reports read it from here.
    from cases.generated_matrix import GENERATED_MATRIX

    found[GENERATED_MATRIX.id] = GENERATED_MATRIX
    # issue 22 first: it is the project's reason to exist and the default matrix.
    return dict(sorted(found.items(), key=lambda item: item[0] != "issue22"))


REGRESSIONS: dict[str, Regression] = _discover()
