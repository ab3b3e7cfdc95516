"""Seeding torch's random numbers for a case: `torch.manual_seed`, without what it costs on a
machine without an accelerator.

There, `torch.manual_seed` also queues a lazy seed for each accelerator module (cuda, xpu,
...) that could still be initialised, and each queued call stores a formatted stack of its
caller; deep under pytest that is about 0.8 ms a call, a fifth of a small case's time. With no
accelerator available nothing can ever run those queued calls, so seeding the CPU generator
changes exactly what `torch.manual_seed` changes there. With one, it is `torch.manual_seed`.
"""

from __future__ import annotations

import torch


def manual_seed(seed: int) -> None:
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)
