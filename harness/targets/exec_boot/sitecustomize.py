"""Imported by Python at start-up in a `repro exec` process (this folder is first on PYTHONPATH):
loads the chosen target before the user's script runs. Nothing else lives in this folder."""

from harness.targets.site import activate

activate()
