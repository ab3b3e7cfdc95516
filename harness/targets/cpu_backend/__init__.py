"""CPU backend: what stands in for TE's compiled parts, so the whole Python package runs as shipped.

`boundary` (the import boundary: the shared library is not loaded), `extension` (the
`transformer_engine_torch` module built per target), `kernels` (its plain-torch kernels),
`device` (the device TE asks about: one without FP8), `strict` (modules neither the target
nor the environment has, named in a fork config).
"""
