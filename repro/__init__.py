"""What the user touches: the `repro` command line and the rendering of runs."""

import harness  # noqa: F401 — first, so torch is never imported with device backend autoload on
