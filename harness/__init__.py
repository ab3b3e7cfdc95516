"""The engine: target sources, the CPU backend, patching, devices, the pytest runner and checks."""

import os

# A torch_npu without CANN makes a bare `import torch` fail (DESIGN.md). Device backends
# are therefore not autoloaded; the npu device imports torch_npu itself, explicitly.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
