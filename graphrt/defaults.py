"""What an :class:`~graphrt.LLM`'s engine is built with unless told otherwise (``graphrt serve``'s too).

One place for the sizes, the capture policy and the sampling extras, so that ``LLM("smollm2")``
and ``graphrt serve --model smollm2`` build the same engine and capture the same graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from graphrt.engine import EngineConfig

#: Engine sizes on a CPU unless given (what ``graphrt serve`` uses there): the KV cache and the
#: emulated graphs of the engine's defaults (32 requests of 2048 tokens) outgrow a small host.
CPU_SIZES = {"max_batch_size": 8, "max_context_len": 1024}
#: Top log-probabilities an LLM's engine computes per step unless given (OpenAI's cap), so that
#: ``logprobs=`` works out of the box: one small op more per sampling step. Its engine also keeps
#: token counts for the penalties and token masks for grammars unless told otherwise.
MAX_LOGPROBS = 20
#: How an LLM's engine captures its graphs unless told: each (mode, bucket) the first time a
#: step needs it, so a cold start pays for the graphs its first answer runs, not the ladder's.
CAPTURE = "lazy"


def default_sizes(cuda: bool) -> dict[str, int]:
    """``max_batch_size`` and ``max_context_len`` of an LLM's engine unless given (``graphrt
    serve``'s too): the engine's defaults on CUDA, :data:`CPU_SIZES` on a CPU."""
    if not cuda:
        return dict(CPU_SIZES)
    config = EngineConfig()
    return {"max_batch_size": config.max_batch_size, "max_context_len": config.max_context_len}


def engine_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """The engine options an LLM adds unless ``options`` give them: the sizes, lazy capture and,
    on one rank without speculation, logprobs, penalties and token masks. With ``tp > 1`` the
    capture policy is left to the engine's default, which every other rank's engine shares."""
    tp, device = options.get("tp", 1), options.get("device")
    cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    defaults: dict[str, Any] = default_sizes(cuda) | ({"capture": CAPTURE} if tp == 1 else {})
    if options.get("speculative") is None and tp == 1:  # NOTE: neither computes logprobs or penalties
        defaults |= {"max_logprobs": MAX_LOGPROBS, "penalties": True, "token_masks": True}
    return defaults
