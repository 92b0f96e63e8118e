"""``graphrt tune``'s attention half: the split decode kernel's warps per head dim and its waves.

The split count aims at ``decode_waves`` waves of the GPU's SMs; each program runs on
``decode_warps[head dim]`` warps. Every (head dim, batch) of :data:`CASES` (Llama's 32 query /
8 KV heads, :data:`CONTEXT` keys a row, pages of 16) runs every candidate of :data:`WARPS` and
:data:`WAVES` in one CUDA graph of :data:`COPIES` launches on distinct caches (so the KV is read
from HBM, not L2), checked against a torch reference (gather the pages, softmax in fp32). The
waves with the least time summed over the cases win, then per head dim the fastest warps.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from graphrt.attention.split_decode import attend as dk
from graphrt.kernels import tuning
from graphrt.tools.bench import gemm

#: ``(head dim, batch)`` timed.
CASES = ((64, 1), (64, 16), (128, 1), (128, 16))
HEADS, HEADS_K, PAGE = 32, 8, 16
CONTEXT = 4096
COPIES = 4
WARPS = {64: (2, 4, 8), 128: (4, 8, 16)}
WAVES = (1, 2, 3, 4)
#: Relative L2 error against the fp32 reference that counts as the same attention (bf16 output).
AGREE = 1e-2


def _cache(batch: int, d: int, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """``(k_cache, v_cache, page_table, seqlens)``: ``batch`` rows of :data:`CONTEXT` keys."""
    gen = torch.Generator(device).manual_seed(seed)
    per = CONTEXT // PAGE
    k, v = (
        torch.randn(batch * per, PAGE, HEADS_K, d, device=device, generator=gen).bfloat16() for _ in range(2)
    )
    table = torch.randperm(batch * per, device=device, generator=gen).view(batch, per).int()
    seqlens = torch.full((batch,), CONTEXT, dtype=torch.int32, device=device)
    return k, v, table, seqlens


def reference(q: torch.Tensor, cache: tuple[torch.Tensor, ...], scale: float) -> torch.Tensor:
    """Decode attention in torch (fp32): ``q [B, H, D]`` over each row's pages -> ``[B, H, D]``."""
    k_cache, v_cache, table, seqlens = cache
    out = []
    for b in range(q.shape[0]):
        n = int(seqlens[b])
        k = k_cache[table[b].long()].flatten(0, 1)[:n].float().repeat_interleave(HEADS // HEADS_K, 1)
        v = v_cache[table[b].long()].flatten(0, 1)[:n].float().repeat_interleave(HEADS // HEADS_K, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * scale, dim=-1)
        out.append(torch.einsum("hn,nhd->hd", p, v))
    return torch.stack(out).to(q.dtype)


def _agree(outs: list[torch.Tensor], ref: list[torch.Tensor], what: str) -> None:
    a, b = torch.stack(outs).float(), torch.stack(ref).float()
    rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    if not rel <= AGREE:
        raise gemm.ParityError(f"split decode {what}: differs from torch (relative L2 {rel:.3g} > {AGREE:g})")


def sweep(
    base: tuning.TuningTable, iters: int, device: torch.device
) -> dict[tuple[int, int, int, int], float]:
    """p50 µs per launch of every ``(head dim, batch, warps, waves)``."""
    out: dict[tuple[int, int, int, int], float] = {}
    sms, keys = dk.sms(device), CONTEXT
    for d, batch in CASES:
        caches = [_cache(batch, d, device, seed) for seed in range(COPIES)]
        q = torch.randn(batch, HEADS, d, device=device).bfloat16()
        scale = d**-0.5
        ref = [reference(q, c, scale) for c in caches]
        for warps in WARPS[d]:
            for waves in WAVES:
                table = replace(base, decode_warps=((d, warps),), decode_waves=waves)
                with tuning.using(table):
                    splits = dk.num_splits(batch, HEADS_K, keys, sms)
                    fn = lambda a, c, s=splits, sc=scale: dk.decode_attention(a, *c, sc, s, True)  # noqa: E731
                    us, outs = gemm._graph_us(fn, q, caches, iters)
                _agree(outs, ref, f"D={d} bs={batch} warps={warps} waves={waves}")
                out[(d, batch, warps, waves)] = us["p50"]
        del caches
        torch.cuda.empty_cache()
    return out


def pick(us: dict[tuple[int, int, int, int], float], base: tuning.TuningTable) -> tuple[tuple, int]:
    """``(decode_warps, decode_waves)``: the waves with the least summed time (each head dim on its
    best warps), then each swept head dim's fastest warps; other head dims keep ``base``'s."""

    def cost(d: int, warps: int, waves: int) -> float:
        return sum(t for (dd, _, w, wv), t in us.items() if (dd, w, wv) == (d, warps, waves))

    dims = sorted({d for d, _ in CASES})
    waves = min(WAVES, key=lambda wv: sum(min(cost(d, w, wv) for w in WARPS[d]) for d in dims))
    chosen = {d: min(WARPS[d], key=lambda w: cost(d, w, waves)) for d in dims}
    warps = tuple(sorted({**dict(base.decode_warps), **chosen}.items()))
    return warps, waves
