"""The sampling buffer group: each request row's sampling parameters and its draw counter.

Host-written, one row per request (``max_bs`` rows), like the step group: the sampler in the
program (:func:`graphrt.runtime.sampler.draw.sample`) reads them inside the captured graph, so a
replay samples with this step's parameters without a host sync or a re-capture. Pad rows (and
the rows of a batch without ``Batch.sampling``) are greedy: temperature 0, no filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphrt.buffers import BufferSpec, PadRule, StaticBuffers
from graphrt.metadata.groups import GroupRow
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES
from graphrt.step.sampling import GREEDY, SamplingParams

SAMPLING_SPECS = (
    BufferSpec("temperature", ("max_bs",), torch.float32, PadRule("const", 0.0), host=True),
    BufferSpec("top_k", ("max_bs",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("top_p", ("max_bs",), torch.float32, PadRule("const", 1.0), host=True),
    BufferSpec("min_p", ("max_bs",), torch.float32, PadRule("const", 0.0), host=True),
    BufferSpec("seed", ("max_bs",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("position", ("max_bs",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("presence_penalty", ("max_bs",), torch.float32, PadRule("const", 0.0), host=True),
    BufferSpec("frequency_penalty", ("max_bs",), torch.float32, PadRule("const", 0.0), host=True),
    BufferSpec("repetition_penalty", ("max_bs",), torch.float32, PadRule("const", 1.0), host=True),
)

#: What a row of each buffer holds for a request, from its :class:`SamplingParams`.
FIELDS = {
    "temperature": lambda p: p.temperature,
    "top_k": lambda p: p.top_k,
    "top_p": lambda p: p.top_p,
    "min_p": lambda p: p.min_p,
    # NOTE: a request without a seed is written seed 0; the engine always gives sampled
    # requests a seed, so only greedy rows (which draw nothing) ever get here without one.
    "seed": lambda p: p.seed or 0,
    "presence_penalty": lambda p: p.presence_penalty,
    "frequency_penalty": lambda p: p.frequency_penalty,
    "repetition_penalty": lambda p: p.repetition_penalty,
}


@dataclass(slots=True)
class SamplingBuffers:
    """Per request row ``[R]``: ``temperature``, ``top_p``, ``min_p`` float32; ``top_k``, ``seed``
    and ``position`` (the position the sampled token takes: the draw's counter) int64; the
    penalties float32 (:mod:`graphrt.runtime.penalties`; neutral: 0, 0, 1)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    position: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    repetition_penalty: torch.Tensor


def write_sampling_host(
    params: Sequence[SamplingParams], positions: np.ndarray, host: dict[str, np.ndarray], rows: int
) -> None:
    """Rows ``[:len(params)]`` from ``params`` and ``positions``; rows up to ``rows`` greedy pads.

    ``params`` may be empty (a batch without ``Batch.sampling``): every row is then greedy.
    """
    n = len(params)
    # NOTE: batches mostly share one params object (greedy); list.count is one C loop
    # (identity first), against a Python call per field per row.
    shared = params[0] if n and params.count(params[0]) == n else None
    for name, value in FIELDS.items():
        column = host[name]
        column[:n] = value(shared) if shared is not None else [value(p) for p in params]
        column[n:rows] = value(GREEDY)
    host["position"][:n] = positions[:n]
    host["position"][n:rows] = 0


class SamplingWriter:
    """The sampling group's host half: :func:`write_sampling_host` into its next mirror, or
    nothing (no copy needed) when the device already holds what this step would write.

    That is when every row is greedy (``temperature == 0``, whatever its seed or stop tokens)
    and unpenalised: such rows read only their temperature and penalties, so once rows ``[0, rows)`` hold greedy values on
    the device (``greedy_rows``, which :meth:`forget` clears) an all-greedy step has nothing to
    change there. NOTE: on a slow host each skipped copy and event saved tens of µs per step.
    """

    def __init__(self) -> None:
        self.greedy_rows = 0

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        params = batch.sampling or ()
        greedy = params.count(GREEDY) == len(params) or all(p.greedy and not p.penalised for p in params)
        if greedy and self.greedy_rows >= rows:
            return False
        write_sampling_host(params, batch.seq_lens, group.next_mirror(), rows)
        self.greedy_rows = rows if greedy else 0
        return True

    def forget(self) -> None:
        self.greedy_rows = 0


#: Exists with ``RuntimeConfig(sample=True)``; used by the modes that sample.
SAMPLING_GROUP = GroupRow(
    "sampling",
    lambda g, dims: SAMPLING_SPECS,
    lambda g: SamplingBuffers,
    exists=lambda g: g.sample,
    used_by=lambda mode, g: MODES[mode].samples,
    writer=lambda g, dims, device: SamplingWriter(),
)


def sampling_inputs(
    params: Sequence[SamplingParams], positions: Sequence[int], device: torch.device
) -> SamplingBuffers:
    """Exact-size buffers for ``params`` on ``device``, written by :func:`write_sampling_host`.

    For sampling outside a runtime step (e.g. from logits the caller already holds).
    """
    n = len(params)
    host = {s.name: np.empty(n, dtype=torch.empty((), dtype=s.dtype).numpy().dtype) for s in SAMPLING_SPECS}
    write_sampling_host(params, np.asarray(positions, dtype=np.int64), host, n)
    return SamplingBuffers(**{k: torch.from_numpy(v).to(device) for k, v in host.items()})
