"""Bad input to a cross-attention model: a clear error naming the value and the limit, and
nothing written (encoder cache, its table, the step's buffers, the KV ledger)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt import Batch, ForwardMode, GraphRuntime
from graphrt.attention import Backend
from graphrt.engine.stack import ModelStack
from graphrt.step.modes import SpecGeometry
from tests.support.cross_util import cross_stack

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def stack() -> ModelStack:
    stack = cross_stack(CPU, backend="reference")
    stack.model.encode_into(stack.encoder, 0, [1, 2, 3])
    return stack


def snapshot(stack: ModelStack) -> list[torch.Tensor]:
    """Every tensor bad input must leave alone."""
    enc = stack.encoder
    assert enc is not None
    arenas = [g.arena.clone() for g in stack.runtime.groups.groups.values()]
    return [*arenas, *(t.clone() for t in (*enc.kv.k, *enc.kv.v, enc.pages, enc.lens))]


def unchanged(stack: ModelStack, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, snapshot(stack), strict=True))


def test_encoder_input_too_long_is_refused_untouched(stack: ModelStack) -> None:
    before, lens = snapshot(stack), stack.encoder.host_lens.copy()
    with pytest.raises(ValueError, match=r"encoder input of 65 tokens: must be 1\.\.64 \(max_encoder_len\)"):
        stack.model.encode_into(stack.encoder, 1, list(range(65)))
    with pytest.raises(ValueError, match=r"encoder input of 0 tokens"):
        stack.model.encode_into(stack.encoder, 1, [])
    with pytest.raises(ValueError, match=r"encoder token id 512 out of range \[0, 512\)"):
        stack.model.encode_into(stack.encoder, 1, [3, 512])
    with pytest.raises(ValueError, match=r"encoder row 6 out of range \[0, 6\)"):
        stack.model.encode_into(stack.encoder, 6, [3])
    assert unchanged(stack, before) and (stack.encoder.host_lens == lens).all()


def test_encoder_cache_refuses_a_longer_output_than_it_holds(stack: ModelStack) -> None:
    """The cache's own check (a model with a longer encoder than the cache was built for)."""
    before = snapshot(stack)
    k = torch.zeros(65, 2, 64)
    with pytest.raises(ValueError, match=r"encoder input of 65 tokens does not fit: it must be 1\.\.64"):
        stack.encoder.write(1, [(k, k), (k, k)])
    with pytest.raises(ValueError, match=r"1 cross layers of K/V for an encoder cache of 2"):
        stack.encoder.write(1, [(k[:3], k[:3])])
    assert unchanged(stack, before)


def test_step_of_a_row_without_encoder_output_is_refused_untouched(stack: ModelStack) -> None:
    """Row 1 was never encoded: its step would attend to nothing (or a stale request's output)."""
    before, ledger = snapshot(stack), stack.req_to_token.valid_lens.copy()
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=[1, 2],
        seq_lens=[1, 1],
        req_pool_indices=[0, 1],
        out_cache_loc=[0, 40],
        q_lens=[1, 1],
    )
    with pytest.raises(ValueError, match=r"request row 1 \(request 1 of the batch\) has no encoder output"):
        stack.runtime.run(batch)
    assert unchanged(stack, before) and (stack.req_to_token.valid_lens == ledger).all()
    stack.encoder.free(0)
    with pytest.raises(ValueError, match=r"request row 0 .* has no encoder output"):
        stack.runtime.run(
            Batch.create(
                ForwardMode.DECODE, input_ids=[1], seq_lens=[1], req_pool_indices=[0], out_cache_loc=[0]
            )
        )
    stack.model.encode_into(stack.encoder, 0, [1, 2, 3])


def test_runtime_refuses_what_cross_attention_does_not_graph(stack: ModelStack) -> None:
    config = dataclasses.replace(
        stack.runtime.config,
        capture_modes=(ForwardMode.TARGET_VERIFY,),
        speculative=SpecGeometry(num_steps=2),
    )
    with pytest.raises(ValueError, match="graphed for DECODE only, not capture_modes TARGET_VERIFY"):
        GraphRuntime(stack.model, stack.kv, stack.req_to_token, config, encoder=stack.encoder)


def test_backend_without_cross_attention_says_so() -> None:
    with pytest.raises(ValueError, match="attention backend 'backend' has no cross-attention"):
        Backend().cross(None, None)  # type: ignore[arg-type]


def test_cross_layer_without_an_encoder_cache_says_so(stack: ModelStack) -> None:
    """The model on a runtime built without ``encoder=``: a clear error at its first cross layer."""
    bare = GraphRuntime(stack.model, stack.kv, stack.req_to_token, stack.runtime.config)
    batch = Batch.create(
        ForwardMode.DECODE, input_ids=[1], seq_lens=[1], req_pool_indices=[5], out_cache_loc=[160]
    )
    with pytest.raises(ValueError, match="cross layer 0 reads an encoder cache, but the runtime has none"):
        bare.run(batch, eager=True)
