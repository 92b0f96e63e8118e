"""Debug aids: snapshots of a runtime (JSON + ``.npz``) and graph-vs-eager parity sweeps.

Used by ``tools/`` (inspect, the TUI) and by tests; the runtime never imports this package.
"""

from graphrt.debug.parity import ParityResult, check_parity, parity_sweep
from graphrt.debug.snapshot import Snapshot, SnapshotVersionError, load_snapshot, save_snapshot, take_snapshot

__all__ = [
    "ParityResult",
    "Snapshot",
    "SnapshotVersionError",
    "check_parity",
    "load_snapshot",
    "parity_sweep",
    "save_snapshot",
    "take_snapshot",
]
