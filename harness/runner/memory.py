"""The per-worker memory bound (`--max-rss`): a case that allocates without limit fails its
own allocation and is recorded as over the bound, instead of taking the machine.

The bound is RLIMIT_DATA, the private writable memory the kernel lets the process map (heap
and anonymous mmaps, where malloc puts large tensors): close to what a worker can make
resident, without counting the address space that shared libraries only reserve (a worker
that has imported torch and TE holds about 0.35 GiB of it).
"""

from __future__ import annotations

import os
import re
import resource
from typing import Any

GIB = 1 << 30
SHARE_OF_MEMORY = 0.8  # of the machine's memory, split over the workers: the controller and the OS keep the rest
ERROR_TYPE = "MemoryBound"
# What torch's CPU allocator and Python say when an allocation is refused.
_REFUSED = re.compile(r"can't allocate memory|Cannot allocate memory|out of memory", re.IGNORECASE)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_rss(workers: int) -> int:
    """Bytes per worker when `--max-rss` is not given."""
    return int(physical_memory() * SHARE_OF_MEMORY / max(1, workers))


def bound(limit: int) -> None:
    """Hold this process to `limit` bytes of data from now on (0: no bound)."""
    if limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def refused_allocation(error: dict[str, Any] | None) -> bool:
    """Whether an observed exception is an allocation the bound refused."""
    if not error:
        return False
    return error.get("type") == "MemoryError" or bool(_REFUSED.search(str(error.get("message"))))


def over_bound_note(limit: int) -> str:
    return f"over the memory bound: a worker may hold {limit / GIB:.1f} GiB (--max-rss)"
