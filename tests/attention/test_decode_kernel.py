"""The split decode attention kernel against a float64 loop over each request's pages.

GPU only (Triton on CUDA). Shapes: Llama-3.2-1B (32 / 8 heads, D 64), Llama-3-8B (32 / 8, D 128),
SmolLM2 (9 / 3, D 64), MHA (4 / 4); page sizes 1 and 16; lengths on and off page and block
edges; every split count from 1 to more splits than key blocks; a request with no keys.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.attention.split_decode import attend as dk

GPU = pytest.mark.skipif(not (torch.cuda.is_available() and dk.triton is not None), reason="no CUDA / Triton")
#: bf16 rounds q, k, v and the output; fp32 sums in another order than the oracle's.
ATOL = 2e-2


def case(lens: list[int], heads: int, heads_k: int, d: int, page: int, max_pages: int, seed: int = 0):
    """Random q and caches; request ``i``'s pages are a shuffled set (not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    b = len(lens)
    pages = b * max_pages + 1
    perm = torch.randperm(pages - 1, generator=gen)[: b * max_pages] + 1  # NOTE: page 0: the pad page
    table = perm.view(b, max_pages).to(torch.int32)
    k = torch.randn(pages, page, heads_k, d, generator=gen)
    v = torch.randn(pages, page, heads_k, d, generator=gen)
    q = torch.randn(b, heads, d, generator=gen)
    cuda = [t.cuda().bfloat16() for t in (q, k, v)]
    return (*cuda, table.cuda(), torch.tensor(lens, dtype=torch.int32).cuda())


def oracle(q, k, v, table, lens, scale: float, window: int | None = None, sinks=None) -> torch.Tensor:
    """Each request's last query over its keys (``window``: positions ``n - 1 - window ..`` only;
    ``sinks [Hq]``: ``exp(sink)`` joins each head's denominator), in float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[2]
    for i, n in enumerate(lens.tolist()):
        pos = torch.arange(0 if window is None else max(0, n - 1 - window), n)
        slots = table[i].cpu().long()[pos // k.shape[1]], pos % k.shape[1]
        keys, vals = k.cpu().double()[slots], v.cpu().double()[slots]  # [n, Hk, D]
        for h in range(q.shape[1]):
            if n == 0:
                continue
            scores = keys[:, h // group] @ q[i, h].cpu().double() * scale
            if sinks is not None:
                scores = torch.cat((scores, sinks[h].double().cpu().view(1)))
            p = torch.softmax(scores, dim=0)[: len(pos)]
            out[i, h] = p @ vals[:, h // group]
    return out


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize(("heads", "heads_k", "d"), [(32, 8, 64), (32, 8, 128), (9, 3, 64), (4, 4, 64)])
@pytest.mark.parametrize("page", [1, 16])
def test_matches_the_oracle_at_every_split_count(heads: int, heads_k: int, d: int, page: int) -> None:
    max_pages = 160 // page
    lens = [1, 16, 17, 63, 64, 65, 129, 160]
    q, k, v, table, seqlens = case(lens, heads, heads_k, d, page, max_pages)
    scale = d**-0.5
    expected = oracle(q, k, v, table, seqlens, scale)
    for splits in (1, 2, 3, dk.num_splits(len(lens), heads_k, 160, 132), 7):
        out = dk.decode_attention(q, k, v, table, seqlens, scale, splits)
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(
            out.double().cpu(), expected, atol=ATOL, rtol=ATOL, msg=lambda m, s=splits: f"{s}: {m}"
        )


@pytest.mark.gpu
@GPU
def test_a_request_without_keys_gets_zeros_and_others_are_untouched() -> None:
    q, k, v, table, seqlens = case([0, 40, 0, 5], 8, 2, 64, 16, 4)
    out = dk.decode_attention(q, k, v, table, seqlens, 0.125, 3).double().cpu()
    assert out[0].abs().max() == 0 and out[2].abs().max() == 0
    torch.testing.assert_close(out, oracle(q, k, v, table, seqlens, 0.125), atol=ATOL, rtol=ATOL)


@pytest.mark.gpu
@GPU
def test_a_graph_replay_reads_new_lengths_and_pages_in_place() -> None:
    """Captured once, then lengths and page table rewritten in place: each replay equals an eager
    call on the new values, bit for bit (the splits are fixed; the shares follow the lengths)."""
    q, k, v, table, seqlens = case([30, 70, 5], 32, 8, 64, 16, 8)
    splits = dk.num_splits(3, 8, 128, torch.cuda.get_device_properties(0).multi_processor_count)
    dk.decode_attention(q, k, v, table, seqlens, 0.125, splits)  # NOTE: compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dk.decode_attention(q, k, v, table, seqlens, 0.125, splits)
    for lens in ([31, 71, 6], [128, 1, 64], [0, 2, 100]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        table.copy_(table.flip(1))
        graph.replay()
        eager = dk.decode_attention(q, k, v, table, seqlens, 0.125, splits)
        assert torch.equal(out, eager), lens


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("window", [None, 0, 5, 64, 100])
def test_sliding_windows_and_sinks_match_the_oracle(window: int | None) -> None:
    """gpt-oss's layers: a sliding window (keys ``p - window .. p``) or all keys, a sink per head."""
    lens = [0, 1, 6, 64, 65, 130, 160]
    q, k, v, table, seqlens = case(lens, 64, 8, 64, 16, 10, seed=2)
    sinks = torch.randn(64, generator=torch.Generator().manual_seed(3)).cuda().bfloat16()
    expected = oracle(q, k, v, table, seqlens, 0.125, window, sinks)
    for splits in (1, 3, 9):
        out = dk.decode_attention(q, k, v, table, seqlens, 0.125, splits, True, window, sinks)
        torch.testing.assert_close(out.double().cpu(), expected, atol=ATOL, rtol=ATOL)


def test_the_split_rule_fills_two_waves_within_the_key_blocks() -> None:
    assert dk.num_splits(1, 8, 528, 132) == 9  # 9 blocks of 64 keys: 72 programs
    assert dk.num_splits(1, 8, 8192, 132) == 33  # 264 programs: two waves
    assert dk.num_splits(64, 8, 8192, 132) == 1 and dk.num_splits(1, 3, 64, 132) == 1


def test_only_single_token_steps_take_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule a backend applies (``takes``), on CPU tensors with the switch forced on: one
    token per request, no options, 16-bit tensors; FA3 yields it the buckets whose ``requests x
    KV heads`` cover under 80 % of the SMs."""
    from graphrt.attention.fa3_plan import leaves_gpu_short
    from tests.support.paged_util import paged_case

    monkeypatch.setattr(dk, "enabled", lambda device: True)
    device = torch.device("cpu")
    decode = paged_case(device, 16, 96, [5, 40, 96], [1, 1, 1])
    q, k = decode.q.bfloat16(), decode.k_cache.bfloat16()
    sinks = torch.zeros(q.shape[1], dtype=torch.bfloat16)
    assert dk.takes(q, k, decode.meta) and dk.takes(q, k, decode.meta, 128, sinks)
    assert not dk.takes(q, k, decode.meta, kv_scales=object()) and not dk.takes(q, k, decode.meta, qv=q)
    assert not dk.takes(q, k, decode.meta, sinks=sinks[:-1]), "a sink per query head"
    extend = paged_case(device, 16, 96, [5, 40, 96], [5, 7, 30])
    assert not dk.takes(extend.q.bfloat16(), extend.k_cache.bfloat16(), extend.meta)
    assert not dk.takes(q.float(), k.float(), decode.meta)
    assert leaves_gpu_short(3, 2, 132) and not leaves_gpu_short(3, 2, 7)  # NOTE: 6 >= 0.8 x 7
