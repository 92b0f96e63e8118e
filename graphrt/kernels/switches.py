"""Every ``GRAPHRT_*`` environment switch, declared once, and the frozen record they are read into.

:data:`TABLE` declares each switch (name, default, kind, doc); docs/switches.md is its table for
readers (a test keeps the two equal). :func:`read` parses the environment into a frozen
:class:`Switches` record, refusing a bad value or an unknown ``GRAPHRT_*`` name with an error
naming both. The process holds one record: building a runtime reads it anew (:func:`refresh`),
the capture report carries it, and the kernels consult it (:func:`active`) instead of the
environment, so no step reads ``os.environ``.

A kernel switch takes ``1`` (default: the Triton kernel on CUDA), ``0`` (the torch code it
replaces, on CUDA too: debugging, A/B timing) or ``interpret`` (the kernel on the CPU through
Triton's interpreter; needs ``TRITON_INTERPRET=1`` before triton is imported; tests only: the
emulated capture engine cannot record a Triton launch).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

try:  # NOTE: optional: the CPU build of torch may come without a usable Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

#: Value of a parsed switch.
Value = bool | int | float | str


def _kernel(name: str, raw: str) -> Value:
    return _choice(name, raw, ("1", "0", "interpret"))


def _flag(name: str, raw: str) -> Value:
    if raw.strip() not in ("0", "1"):
        raise ValueError(f"{name}={raw!r}: expected 1 or 0")
    return raw.strip() == "1"


def _bytes(name: str, raw: str) -> Value:
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise ValueError(f"{name}={raw!r}: expected a positive number of bytes")
    return limit


def _float(name: str, raw: str, positive: bool, expected: str) -> Value:
    """``raw`` as a float, > 0 (``positive``) or >= 0; nan and text are refused with ``expected``."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 if positive else value >= 0):  # NOTE: nan fails both
        raise ValueError(expected.format(f"{name}={raw!r}"))
    return value


def _seconds(name: str, raw: str) -> Value:
    return _float(name, raw, True, "{}: expected a positive number of seconds")


def _gib(name: str, raw: str) -> Value:
    return _float(name, raw, False, "{} is not a number of GiB >= 0")


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> Value:
    if raw not in choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return raw


#: Kind of a switch -> its parser ``(name, raw) -> value`` (``choice`` kinds use ``Switch.choices``).
PARSERS: dict[str, Callable[[str, str], Value]] = {
    "kernel": _kernel,
    "flag": _flag,
    "bytes": _bytes,
    "seconds": _seconds,
    "GiB": _gib,
}


@dataclass(frozen=True, slots=True)
class Switch:
    """One declared switch: environment name, default (as it would be written), kind, what it does."""

    name: str
    default: str
    kind: str  # a key of PARSERS, or "choice" (one of ``choices``)
    doc: str
    choices: tuple[str, ...] = ()

    def parse(self, raw: str) -> Value:
        """``raw`` as this switch's value; ``ValueError`` naming the switch and the value."""
        if self.kind == "choice":
            return _choice(self.name, raw, self.choices)
        return PARSERS[self.kind](self.name, raw)


_K = "kernel"
#: Every switch, one row each (docs/switches.md shows the same table).
TABLE: tuple[Switch, ...] = (
    Switch("GRAPHRT_FUSED_UPDATE", "1", _K, "the step's metadata update as one Triton kernel"),
    Switch("GRAPHRT_FUSED_FEED", "1", _K, "the fed step's token feed as Triton kernels"),
    Switch(
        "GRAPHRT_FUSED_ROPE_STORE", "1", _K, "RoPE and the KV store (MLA: + latent norm) as one Triton kernel"
    ),
    Switch("GRAPHRT_COS_SIN", "1", _K, "the step's RoPE cos/sin rows as one Triton kernel"),
    Switch("GRAPHRT_SKINNY_GEMM", "1", _K, "the skinny Triton GEMM for steps of few rows"),
    Switch("GRAPHRT_FUSED_PROLOGUE", "1", _K, "RMSNorm and SiLU-and-mul inside the skinny GEMMs"),
    Switch("GRAPHRT_DECODE_ATTENTION", "1", _K, "single-token decode through the split-decode kernel"),
    Switch(
        "GRAPHRT_FUSED_SAMPLER",
        "1",
        _K,
        "in-graph sampling as Triton kernels: the draw, masks, penalties, logprobs",
    ),
    Switch("GRAPHRT_FUSED_MOE", "1", _K, "MoE routing alignment and expert GEMMs as Triton kernels"),
    Switch(
        "GRAPHRT_PDL",
        "1",
        "flag",
        "PDL for every Triton kernel (GEMMs, prologues, attention, MoE, sampler, p2p)",
    ),
    Switch("GRAPHRT_FUSED_OPS", "1", "flag", "sgl_kernel's fused RMSNorm / SiLU ops when it imports"),
    Switch("GRAPHRT_FA3_PLAN", "1", "flag", "FA3's scheduler metadata planned once per step"),
    Switch(
        "GRAPHRT_ALLREDUCE",
        "auto",
        "choice",
        "TP small-sum path: p2p kernel (auto: NCCL if unusable), p2p, torch one-shot, NCCL",
        ("nccl", "auto", "oneshot", "p2p"),
    ),
    Switch("GRAPHRT_P2P_MAX_BYTES", str(256 * 1024), "bytes", "largest sum the p2p kernel takes"),
    Switch("GRAPHRT_ONESHOT_MAX_BYTES", str(256 * 1024), "bytes", "largest sum torch's one-shot takes"),
    Switch(
        "GRAPHRT_STEP_CHANNEL", "shm", "choice", "TP step broadcast: shared memory or gloo", ("shm", "gloo")
    ),
    Switch("GRAPHRT_TP_TIMEOUT", "120", "seconds", "how long a collective waits for the other ranks"),
    Switch("GRAPHRT_CACHE", "1", "flag", "converted-weights and tuning-table caches under $XDG_CACHE_HOME"),
    Switch("GRAPHRT_CACHE_MAX_GB", "4", "GiB", "bound on the converted weights the cache keeps"),
)
#: Name -> switch.
BY_NAME: dict[str, Switch] = {s.name: s for s in TABLE}
#: ``GRAPHRT_*`` names the test suite reads for itself (never the library).
TEST_PREFIX = "GRAPHRT_TEST_"
#: ``GRAPHRT_*`` process settings that are not switches: the server's API key (a secret, never
#: recorded in a report; ``graphrt.serve.guard`` reads it).
SETTINGS = ("GRAPHRT_API_KEY",)


@dataclass(frozen=True, slots=True)
class Switches:
    """Every switch's value, read once (:func:`read`); ``interpret``: ``TRITON_INTERPRET=1``."""

    values: tuple[tuple[str, Value], ...]
    interpret: bool = False

    def __getitem__(self, name: str) -> Value:
        for key, value in self.values:
            if key == name:
                return value
        raise KeyError(f"{name} is no declared switch (graphrt.kernels.switches.TABLE)")

    def as_dict(self) -> dict[str, str]:
        """Name -> value as an environment would spell it (the capture report's, the snapshot's)."""
        return {k: (("1" if v else "0") if isinstance(v, bool) else str(v)) for k, v in self.values}

    def changed(self) -> dict[str, str]:
        """The switches whose value is not their default."""
        default = read({}).as_dict()
        return {k: v for k, v in self.as_dict().items() if v != default[k]}


def read(environ: Mapping[str, str] | None = None) -> Switches:
    """Parse ``environ`` (default: the process's) into a :class:`Switches` record.

    Raises ``ValueError`` naming the variable for a bad value or an unknown ``GRAPHRT_*`` name.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(
        k
        for k in env
        if k.startswith("GRAPHRT_")
        and k not in BY_NAME
        and k not in SETTINGS
        and not k.startswith(TEST_PREFIX)
    )
    if unknown:
        raise ValueError(
            f"unknown switch {', '.join(unknown)}: the switches are {', '.join(BY_NAME)} (docs/switches.md)"
        )
    values = tuple((s.name, s.parse(env.get(s.name, s.default))) for s in TABLE)
    return Switches(values, interpret=env.get("TRITON_INTERPRET") == "1")


_active: list[Switches] = []  # NOTE: the process's one record (vLLM's envs.py keeps it the same way)


def active() -> Switches:
    """The process's record: read on first use, read anew by :func:`refresh`."""
    if not _active:
        _active.append(read())
    return _active[0]


def refresh() -> Switches:
    """Read the environment again and make that the process's record (building a runtime does)."""
    record = read()
    _active[:] = [record]
    return record


def forget() -> None:
    """Drop the process's record: the next :func:`active` reads the environment (tests)."""
    _active.clear()


def triton_enabled(name: str, device: torch.device) -> bool:
    """Whether the Triton kernel switched by ``name`` runs for tensors on ``device``."""
    record = active()
    flag = record[name]
    if flag == "0" or triton is None:
        return False
    if device.type == "cuda":
        return True
    return flag == "interpret" and record.interpret


#: The PDL switch of the skinny GEMM, the fused prologues and the split decode attention
#: (``GRAPHRT_PDL=0``: launched without PDL); the sampler has its own.
KERNELS_PDL_ENV = "GRAPHRT_PDL"


def pdl_enabled(name: str, device: torch.device) -> bool:
    """Whether a Triton kernel launches with programmatic dependent launch on ``device``: SM90+
    CUDA devices (never the interpreter) unless its switch ``name`` is ``0``."""
    if device.type != "cuda" or not active()[name]:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


#: Whether the step being traced runs batch-invariant kernels (``RuntimeConfig.deterministic``):
#: set by the runtime around each model forward (eager, warm-up and capture alike), read by the
#: GEMM and attention dispatch. A context variable, so two engines in one process keep their own.
_BATCH_INVARIANT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "graphrt_batch_invariant", default=False
)


def batch_invariant_on() -> bool:
    """Whether the forward now running must give each row the same bits whatever its batch."""
    return _BATCH_INVARIANT.get()


@contextlib.contextmanager
def batch_invariant(on: bool) -> Iterator[None]:
    """Run the enclosed forward with batch-invariant kernels (``on``) or the fastest ones."""
    token = _BATCH_INVARIANT.set(on)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


def cache_root() -> Path | None:
    """``$XDG_CACHE_HOME/graphrt`` (or ``~/.cache/graphrt``): where converted weights and tuning
    tables are kept; None when ``GRAPHRT_CACHE=0`` or no home is known."""
    if not active()["GRAPHRT_CACHE"]:
        return None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # NOTE: no HOME and no passwd entry: no cache
            return None
    return Path(base) / "graphrt"
