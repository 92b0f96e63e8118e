"""The current CUDA stream, cheaply: events recorded every step need it.

``torch.cuda.Event.record()`` without a stream asks ``torch.cuda.current_stream()``, which
resolves the device and builds a new ``Stream`` object each time, three calls per engine step
(docs/performance.md has the cost). :func:`current_stream` reads the raw stream
handle (one C call) and keeps one ``Stream`` per handle.
"""

from __future__ import annotations

import torch

_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def current_stream(device: torch.device) -> torch.cuda.Stream:
    """The current stream of CUDA ``device`` (what ``torch.cuda.current_stream(device)`` returns)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.current_stream(index)
    return stream
