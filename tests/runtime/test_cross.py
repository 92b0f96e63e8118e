"""Cross-attention (``tiny-cross``): DECODE graphs against eager steps and against a plain,
unpaged forward of the whole model; the encoder buffer group's contents and pad rows.

Tolerances: CPU runs float32 with float64 oracle attention, measured max |diff| 3e-6 (1e-4
leaves ~30x headroom; a wrong page, length or pad row moves logits by O(1)). CUDA runs bf16
weights and KV: 5e-2 against the plain forward, as the other bf16 parity tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from tests.support.cross_util import Seqs, cross_stack, plain_logits
from tests.support.util import backends

#: Rows out of order; encoder lengths: one token, a page edge + 1, the full encoder (64).
ROWS = [4, 1, 3]
ENCODER = [[7], list(range(10, 15)), [int(i) * 7 % 500 for i in range(64)]]
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [42]]
STEPS = 4


def atol(device: torch.device) -> float:
    return 5e-2 if device.type == "cuda" else 1e-4


def started(device: torch.device, backend: str, graphs: bool) -> Seqs:
    """Three requests encoded and prefilled; with ``graphs`` DECODE is captured in debug mode
    (every group poisoned before each update, the replay fails if any poison is left)."""
    stack = cross_stack(device, backend=backend, debug=graphs)
    for row, ids in zip(ROWS, ENCODER, strict=True):
        stack.model.encode_into(stack.encoder, row, ids)
    if graphs:
        stack.runtime.capture()
    seqs = Seqs(stack, list(ROWS), [list(p) for p in PROMPTS])
    seqs.prefill()
    return seqs


@pytest.mark.parametrize("backend_index", [0, 1])
def test_cross_decode_graph_matches_eager_and_plain_forward(device: torch.device, backend_index: int) -> None:
    names = backends(device)
    if backend_index >= len(names):
        pytest.skip(f"only {names} here")
    backend = names[backend_index]
    graph, eager = started(device, backend, True), started(device, backend, False)
    for _ in range(STEPS):
        out_g, out_e = graph.decode(), eager.decode(eager=True)
        torch.testing.assert_close(out_g, out_e, atol=atol(device), rtol=0)
    stats = graph.stack.runtime.stats()
    assert stats.replays == {"DECODE": STEPS} and stats.eager == {"EXTEND": 1}
    assert eager.stack.runtime.stats().replays == {}
    for i, ids in enumerate(ENCODER):
        ref = plain_logits(graph.stack.model, ids, graph.tokens[i])
        got = torch.stack(graph.logits[i])
        torch.testing.assert_close(got, ref, atol=atol(device), rtol=0)


def test_cross_output_depends_on_the_encoder_input(device: torch.device) -> None:
    """Same prompt, different encoder input: different logits (the cross layers are read)."""
    stack = cross_stack(device, backend="reference")
    stack.model.encode_into(stack.encoder, 0, [1, 2, 3])
    stack.model.encode_into(stack.encoder, 1, [4, 5, 6])
    seqs = Seqs(stack, [0, 1], [[9, 9], [9, 9]])
    seqs.prefill()
    assert (seqs.logits[0][-1] - seqs.logits[1][-1]).abs().max() > 0.1


def test_encoder_group_holds_each_row_then_pads(device: torch.device) -> None:
    """Exact contents after a bs 3 step (bucket 4), a shrink to bs 2 in the same bucket (row 2
    becomes a pad row) and bs 1 (bucket 1): real rows hold their encoder pages and lengths, pad
    rows the dummy page and length 1."""
    seqs = started(device, "reference", True)
    stack = seqs.stack
    enc, group = stack.encoder, stack.runtime.groups.group("encoder")
    assert group is not None
    pads = stack.runtime.pad_values(ForwardMode.DECODE)
    assert pads["encoder_dummy_page"] == enc.kv.dummy_page
    for keep in (3, 2, 1):
        seqs.rows, seqs.tokens, seqs.logits = seqs.rows[:keep], seqs.tokens[:keep], seqs.logits[:keep]
        seqs.decode()
        bucket = 1 if keep == 1 else 4
        view = group.view(bucket, 1)
        assert group.pad_violations(bucket, 1, keep, pads) == []
        for i, row in enumerate(seqs.rows):
            n, ps = len(ENCODER[i]), enc.kv.page_size
            used = -(-n // ps)
            want = [row * enc.max_pages + j for j in range(used)] + [enc.kv.dummy_page] * (
                enc.max_pages - used
            )
            assert view.encoder_page_table[i].tolist() == want
            assert int(view.encoder_lens[i]) == n
        assert view.encoder_lens[keep:].tolist() == [1] * (bucket - keep)


def test_encoder_rows_are_freed() -> None:
    stack = cross_stack(torch.device("cpu"), backend="reference")
    stack.model.encode_into(stack.encoder, 2, [1, 2])
    assert stack.encoder.host_lens.tolist() == [0, 0, 2, 0, 0, 0]
    stack.encoder.free(2)
    assert not np.any(stack.encoder.host_lens)
