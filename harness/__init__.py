"""The engine: target sources, the CPU backend, patching, devices, the pytest runner and checks."""
