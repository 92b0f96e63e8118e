"""Attention sinks in the models: the ``tiny-sinks`` preset (gpt-oss-style attention with a dense
MLP), sinks as a per-layer weight split like the query heads, and what they change."""

from __future__ import annotations

import torch

from graphrt.models import preset
from graphrt.models.llama import Attention, TinyLlama
from graphrt.parallel import TPGroup


def test_tiny_sinks_alternates_sliding_and_full_layers_with_sinks() -> None:
    cfg = preset("tiny-sinks")
    assert cfg.sinks and [cfg.window(i) for i in range(cfg.num_layers)] == [24, None, 24, None]
    model = TinyLlama.from_seed(cfg, 0, torch.device("cpu"), torch.float32)
    sinks = [layer.attn.sinks for layer in model.layers]
    assert all(s is not None and s.shape == (cfg.num_heads,) for s in sinks)
    assert 0.3 < torch.stack(sinks).std().item() < 3, "seeded with std 1: they must matter"
    assert all(
        layer.attn.sinks is None
        for layer in TinyLlama.from_seed(
            preset("tiny-llama-swa"), 0, torch.device("cpu"), torch.float32
        ).layers
    )


def test_sinks_are_split_like_the_query_heads() -> None:
    cfg = preset("tiny-sinks")
    full = torch.arange(cfg.num_heads, dtype=torch.float32)
    for rank in range(2):
        attn = Attention(cfg, 0, TPGroup(rank=rank, size=2), sinks=True)
        assert attn.sinks is not None and attn.sinks.full_shape == (cfg.num_heads,)
        with torch.no_grad():
            attn.sinks.weight_loader(attn.sinks, full)
        half = cfg.num_heads // 2
        assert attn.sinks.tolist() == full[rank * half : (rank + 1) * half].tolist()


def test_sinks_change_the_logits_and_big_sinks_silence_attention() -> None:
    """With sinks the model's logits move; a sink far above every score takes the whole softmax,
    so each layer's attention adds nothing (the logits equal those of zeroed value projections)."""
    from graphrt import Batch, ForwardMode, RuntimeConfig
    from graphrt.engine.stack import build_stack

    config = RuntimeConfig(max_batch_size=1, max_context_len=32, page_size=16, capture_modes=())
    stack = build_stack("tiny-sinks", torch.device("cpu"), config)
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=list(range(1, 12)),
        seq_lens=[11],
        req_pool_indices=[0],
        out_cache_loc=list(range(11)),
        q_lens=[11],
    )
    with torch.no_grad():
        base = stack.runtime.run(batch)
        layers = [layer.attn for layer in stack.model.layers]
        kept = [a.sinks.clone() for a in layers]
        for a in layers:
            a.sinks.fill_(-float("inf"))
        none = stack.runtime.run(batch)
        for a in layers:
            a.sinks.fill_(1e4)
        silenced = stack.runtime.run(batch)
        for a, k in zip(layers, kept, strict=True):
            a.sinks.copy_(k)
            rows = a.qkv.weight.shape[0] - 2 * a.splits[2]
            a.qkv.weight[rows + a.splits[1] :].zero_()  # NOTE: v's rows: values all zero
        no_values = stack.runtime.run(batch)
    assert ((base - none).norm() / none.norm()).item() > 1e-3
    torch.testing.assert_close(silenced, no_values, atol=1e-5, rtol=1e-5)
