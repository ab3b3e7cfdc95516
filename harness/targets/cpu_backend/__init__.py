"""CPU backend: stand-ins for the TE modules that need the compiled extension, and CPU compute ops.

Everything issue 22 involves (fuser.py, op.py, sequential.py and the pass-through
basic ops) is loaded from the target's own source, unedited. Only the modules listed
in `standins.STANDIN_MODULES` are replaced, and only the compute ops in `ops.py` are ours.
"""
