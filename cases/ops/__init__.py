"""The op database of `te.ops` (database.py), the plain-PyTorch references of TE's ops
(references.py), and the pipelines generated from the database and TE's fusion windows
(generated.py)."""
