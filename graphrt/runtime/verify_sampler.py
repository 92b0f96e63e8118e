"""Sampled verification inside the TARGET_VERIFY graph: one draw per verify node.

Speculative sampling with deterministic drafts (an n-gram's chain, a suffix trie's branches,
a greedy draft model's top tokens: each proposal ``q`` is one-hot) is exact when the target
draws its own token at every node and a draft is accepted iff it equals that draw: draft
``x`` is then accepted with probability ``p(x)``, and on rejection the draw is distributed as
``p`` with ``x`` removed and renormalised, the standard rule. Here each node's draw is the
sampler's own (:func:`graphrt.runtime.sampler.draw.sample`) with its counter at the position the
node's token takes (the node's position + 1), so a request's tokens are the very tokens plain
sampled decoding draws for the same seed, and do not depend on the batch, the bucket, or
graph vs eager. Greedy rows (temperature 0, pads included) take the argmax.
"""

from __future__ import annotations

import dataclasses

import torch

from graphrt.metadata.sampling import SamplingBuffers
from graphrt.runtime.sampler import sample


def node_params(params: SamplingBuffers, positions: torch.Tensor, nodes: int) -> SamplingBuffers:
    """Per verify node ``[R * nodes]``: its request row's parameters, counter ``positions + 1``.

    ``params``: ``[R]`` request rows; ``positions [R * nodes]`` int64: each node's position.
    """
    per_node = {
        f.name: getattr(params, f.name).repeat_interleave(nodes, dim=0) for f in dataclasses.fields(params)
    }
    per_node["position"] = positions + 1
    return SamplingBuffers(**per_node)


def sample_nodes(
    logits: torch.Tensor, params: SamplingBuffers, positions: torch.Tensor, nodes: int
) -> torch.Tensor:
    """The target's token after every node, ``[R, nodes]`` int64, drawn inside the graph.

    Parameters
    ----------
    logits : [R * nodes, V] float
        The verify's logits, request-major (``nodes`` per request row, pad rows included).
    params : SamplingBuffers
        ``[R]`` request rows (the sampling group).
    positions : [R * nodes] int64
        Each node's RoPE position (a tree node's: its prefix length + its depth).
    nodes : int
        Verify nodes per request (``num_draft_tokens``).
    """
    rows = logits.shape[0] // nodes
    return sample(logits, node_params(params, positions, nodes)).view(rows, nodes)
