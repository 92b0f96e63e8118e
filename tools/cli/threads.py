"""``--threads``: the CPU threads torch's intra-op pool runs (every command takes it).

torch's default is one thread per CPU the process may use, which on a box shared with other
work makes every op wait for the busiest core (OpenMP threads spin at each barrier): a decode
step then runs several times slower than on one thread. The default here leaves half the
CPUs to the rest of the box (and stays at 4 at most, past which a small model's ops gain
nothing); ``OMP_NUM_THREADS`` when set is taken as the user's choice.
"""

from __future__ import annotations

import os

#: The most threads the default picks.
MAX_DEFAULT = 4


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when set, else half the usable CPUs, between 1 and :data:`MAX_DEFAULT`."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable // 2, MAX_DEFAULT))


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to ``threads`` (None: :func:`default_threads`); returns it."""
    import torch

    n = default_threads() if threads is None else threads
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
