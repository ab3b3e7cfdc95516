"""harness.engine.seeding.manual_seed leaves torch's random streams as torch.manual_seed does."""

from __future__ import annotations

import torch

from harness.engine import seeding


def test_the_cpu_stream_is_torch_manual_seeds() -> None:
    torch.manual_seed(1234)
    expected = (torch.randn(64), torch.rand(8, dtype=torch.float64), torch.randint(0, 1000, (16,)))
    torch.manual_seed(99)  # another state in between
    torch.randn(3)
    seeding.manual_seed(1234)
    got = (torch.randn(64), torch.rand(8, dtype=torch.float64), torch.randint(0, 1000, (16,)))
    for left, right in zip(expected, got):
        torch.testing.assert_close(right, left, rtol=0, atol=0)
    assert torch.initial_seed() == 1234
