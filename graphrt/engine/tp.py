"""The engine across a TP group: rank 0 schedules and samples, the other ranks run its steps.

``Engine(model, tp=N)`` on every rank of a ``torchrun`` (or any ``torch.distributed``) world.
:func:`generate` is called on every rank: rank 0's prompts are shared first, rank 0 runs the
scheduler (each step broadcast by :class:`~graphrt.runtime.TPRuntime`), the other ranks serve
its steps; the tokens are shared at the end, so every rank returns the same lists. An error
on rank 0 reaches every rank (the same exception type, naming the rank that raised it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphrt.parallel import CollectiveError, Message, Op, StepChannel
from graphrt.runtime import TPRuntime, serve

Generate = Callable[[Sequence[Sequence[int]], Any, Any], list[list[int]]]


def _same_error(shared: tuple[type, str], rank: int, size: int) -> BaseException:
    kind, text = shared
    note = f"{text} [raised on rank 0; seen on rank {rank} of {size}]"
    try:
        return kind(note)
    except Exception:  # NOTE: an exception type whose constructor takes other arguments
        return RuntimeError(f"{kind.__name__}: {note}")


def tp_generate(
    channel: StepChannel,
    runtimes: Mapping[int, TPRuntime],
    generate: Generate,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Any,
    sampling: Any = None,
) -> list[list[int]]:
    """``generate`` on rank 0, :func:`serve` on the others; rank 0's result on every rank.

    Each step carries its rows' sampling parameters (:func:`~graphrt.parallel.pack`), so every
    rank samples the token rank 0 samples.
    """
    group = channel.group
    mine = ([list(map(int, p)) for p in prompts], max_new_tokens, sampling)
    args = channel.share(mine if group.is_driver else None)
    if not group.is_driver:
        end, _ = serve(channel, runtimes)
        if end.op is Op.ABORT:
            raise _same_error(channel.share(None), group.rank, group.size)
        return channel.share(None)
    try:
        out = generate(*args)
    except CollectiveError:
        raise  # NOTE: the group is broken; the other ranks hit their own timeout
    except Exception as err:
        channel.exchange(Message(Op.ABORT))
        channel.share((type(err), str(err)))
        raise
    channel.exchange(Message(Op.STOP))
    return channel.share(out)
