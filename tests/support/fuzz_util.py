"""Random damage to files (bytes and JSON text), and a loop that sees only the documented error.

Used by the checkpoint fuzz (tests/models/test_checkpoint_fuzz.py) and the snapshot fuzz
(tests/debug/test_snapshot_fuzz.py). Every choice comes from a seeded numpy Generator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: Absurd 8-byte counts written over a header (little-endian).
HUGE = (2**32, 2**40, 2**63, 2**64 - 1)


def damaged(blob: bytes, header: int, rng: np.random.Generator) -> bytes:
    """``blob`` cut short, flipped, given an absurd 8-byte count, zeroed or overwritten; most
    damage lands in the first ``header`` bytes (the part a reader trusts)."""
    b, op = bytearray(blob), int(rng.integers(0, 6))
    at = int(rng.integers(0, max(min(header, len(b)) - 8, 1)))
    if op == 0:
        return bytes(b[: int(rng.integers(0, len(b)))])
    if op in (1, 2):
        span = min(header, len(b)) if op == 1 else len(b)
        for i in rng.integers(0, span, int(rng.integers(1, 9))):
            b[int(i)] ^= int(rng.integers(1, 256))
    elif op == 3:
        b[at : at + 8] = HUGE[int(rng.integers(0, len(HUGE)))].to_bytes(8, "little")
    elif op == 4:
        end = at + int(rng.integers(1, 64))
        b[at:end] = bytes(len(b[at:end]))
    else:
        b[at:] = rng.bytes(int(rng.integers(0, 64))) + bytes(b[at + int(rng.integers(0, 64)) :])
    return bytes(b)


#: Values swapped in for a key of a JSON object: zero, negative, absurd, wrong types.
ODD_VALUES = (0, -1, 2**40, "x", 1.5, None, True, [], {"a": 1})


def damaged_json(text: str, rng: np.random.Generator) -> str:
    """Text damage: cut short, a value swapped for an impossible one, deep nesting, garbage."""
    op = int(rng.integers(0, 4))
    if op == 0:
        return text[: int(rng.integers(0, len(text)))]
    if op == 1:
        data = json.loads(text)
        key = str(rng.choice(sorted(data)))
        data[key] = ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]
        return json.dumps(data)
    if op == 2:
        depth = int(rng.choice([50, 5000, 100_000]))
        return text.rstrip()[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    at = int(rng.integers(0, len(text)))
    return text[:at] + rng.bytes(int(rng.integers(1, 16))).decode("latin-1") + text[at + 1 :]


def outcomes(
    copies: int,
    make: Callable[[int, np.random.Generator], Path],
    read: Callable[[Path], object],
    error: type[Exception],
    seed: int,
) -> dict[str, int]:
    """Read ``copies`` damaged copies; each loads or raises ``error`` naming its file (counts)."""
    rng, seen = np.random.default_rng(seed), {"loaded": 0, "refused": 0}
    for i in range(copies):
        path = make(i, rng)
        try:
            read(path)
        except error as err:
            assert str(path) in str(err), f"copy {i}: the message does not name {path}: {err}"
            seen["refused"] += 1
        except BaseException as err:  # NOTE: anything else is the bug this test hunts
            raise AssertionError(f"copy {i} of {path.name}: {type(err).__name__}: {err}") from err
        else:
            seen["loaded"] += 1
    return seen
