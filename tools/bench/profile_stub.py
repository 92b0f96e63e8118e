"""The stubbed runtime of :mod:`tools.bench.profile_engine`: a timer around ``runtime.run``
that may stub decode steps and verify rounds (fresh or prompt-repeating tokens) or skip their
graph replays, and a counter of the torch calls a step makes outside graph replays."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from graphrt import Engine, ForwardMode

#: A prefill's modes: eager EXTEND, or a prefill graph's MIXED replay (``prefill_graph_tokens``).
PREFILLS = (ForwardMode.EXTEND, ForwardMode.MIXED)
#: Prompts' token ids lie in ``[0, PROMPT_IDS)`` (half of tiny-llama's vocabulary: the stub's
#: fresh tokens take the other half).
PROMPT_IDS = 256


class RunTimer:
    """Wraps ``runtime.run`` (the target's, and the draft's when speculative): accumulates the
    ns spent inside them.

    ``stub``: decode steps do not run at all; each returns one token for every request (no
    model, no graph, no checks): the step's time is then the engine's alone, without the noise
    of the CPU model's compute around it. The token is 1, or with ``fresh`` a new one each
    step, counting down from ``vocab - 1`` (above the prompts' ids, a cycle longer than a request): no n-gram or suffix seen
    before, so a proposer never matches and every speculative step backs off. With ``repeat``
    the tokens (verify rounds' too, and a prefill's, which runs) repeat each request's prompt:
    every round drafts and accepts all it offered.
    """

    def __init__(self, engine: Engine, stub: bool = False, fresh: bool = False) -> None:
        self.ns, self.stub, self.fresh, self.skip, self.repeat = 0, stub, fresh, False, False
        self.vocab, self._next = engine.model.cfg.vocab_size, 0
        self.engine = engine
        #: ``--stub-repeat``: each running request's prompt by its request row.
        self.prompts: dict[int, np.ndarray] = {}
        self.calls = TorchCalls()
        self.runtimes = [r for r in (engine.runtime, getattr(engine, "draft_runtime", None)) if r is not None]
        for runtime in self.runtimes:
            runtime.run = self._timed(runtime.run)
        self._wrapped: set[int] = set()
        self._skipping: set[int] = set()

    def _timed(self, run: Any) -> Any:
        def timed(batch: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                if self.stub and self.repeat and batch.mode in PREFILLS:
                    out = run(batch, **kwargs)  # NOTE: a prefill runs; its token starts the repeat
                    with self.calls.paused():
                        return self._fill(out, batch) if out.shape == (batch.bs,) else out
                if not self._stubbed(batch.mode):
                    return run(batch, **kwargs)
                if self.skip:
                    out = run(batch, **kwargs)  # NOTE: its replay skipped (skip_replays)
                    with self.calls.paused():
                        return self._fill(out, batch)
                with self.calls.paused():
                    shape = (batch.bs, batch.input_ids.size // batch.bs)  # NOTE: a verify's [bs, nodes]
                    out = torch.empty(
                        shape if batch.mode is ForwardMode.TARGET_VERIFY else shape[0], dtype=torch.int64
                    )
                    return self._fill(out, batch)
            finally:
                self.ns += time.perf_counter_ns() - start

        return timed

    def _stubbed(self, mode: ForwardMode) -> bool:
        verify = self.repeat and mode is ForwardMode.TARGET_VERIFY
        return self.stub and (mode is ForwardMode.DECODE or verify)

    def _fill(self, out: torch.Tensor, batch: Any) -> torch.Tensor:
        """``out`` (the step's tokens, one per input token) holds the stub's tokens."""
        if not self.repeat:
            return out.fill_(self._token())
        out.view(-1).copy_(torch.from_numpy(self._repeated(batch).reshape(-1)))
        return out

    def _repeated(self, batch: Any) -> np.ndarray:
        """``[bs, nodes]``: the token after each verify node, else ``[bs, 1]`` the token after
        each request's last, its request's prompt repeated."""
        nodes = batch.input_ids.size // batch.bs if batch.mode is ForwardMode.TARGET_VERIFY else 1
        after = batch.seq_lens[:, None] - nodes + 1 + np.arange(nodes)  # NOTE: positions of the tokens out
        rows = batch.req_pool_indices.tolist()
        if any(r not in self.prompts for r in rows):
            self.prompts.update({r.req_idx: np.array(r.prompt) for r in self.engine.running})
        return np.stack([self.prompts[r][a % self.prompts[r].size] for r, a in zip(rows, after, strict=True)])

    def _token(self) -> int:
        if not self.fresh:
            return 1
        self._next += 1
        return self.vocab - 1 - (self._next % (self.vocab - PROMPT_IDS))

    def pause_replays(self) -> None:
        """Make every graph captured so far replay with the torch-call count paused."""
        for runtime in self.runtimes:
            for graph in runtime.dispatcher.graphs.values():
                if id(graph) not in self._wrapped:
                    self._wrapped.add(id(graph))
                    graph.replay = self.calls.pausing(graph.replay)

    def skip_replays(self) -> None:
        """Make every graph captured so far skip its replay while ``skip`` is set."""
        for runtime in self.runtimes:
            for graph in runtime.dispatcher.graphs.values():
                if id(graph) not in self._skipping:
                    self._skipping.add(id(graph))
                    graph.replay = self._skippable(graph.replay)

    def _skippable(self, replay: Any) -> Any:
        def call() -> None:
            if not self.skip:
                replay()

        return call


class TorchCalls(TorchFunctionMode):
    """Counts torch function calls (tensor methods included) while active and not paused."""

    def __init__(self) -> None:
        super().__init__()
        self.n, self._paused = 0, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self._paused:
            self.n += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def pausing(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.paused():
                return fn(*args, **kwargs)

        return call
