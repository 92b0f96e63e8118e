"""Everything a step may write, copied, so a test can show a refused step changed nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphrt import GraphRuntime


def _kv_tensors(kv: Any) -> dict[str, torch.Tensor]:
    """Every tensor of a KV cache (``k``/``v`` lists, MLA ``kv``/``index_k`` lists)."""
    found = {}
    for name, value in vars(kv).items():
        items = value if isinstance(value, list) else [value]
        for i, t in enumerate(items):
            if isinstance(t, torch.Tensor):
                found[f"kv.{name}[{i}]"] = t
    return found


def state_of(runtime: GraphRuntime) -> dict[str, Any]:
    """Copies of the KV cache, ``req_to_token`` (device table and host ledger) and every
    buffer group's device arena and host mirror."""
    r2t = runtime.req_to_token
    state: dict[str, Any] = {name: t.clone() for name, t in _kv_tensors(runtime.kv).items()}
    state["req_to_token"] = r2t.table.clone()
    for name in ("valid_lens", "table", "owner", "refs", "slot_pos", "pinned"):
        state[f"ledger.{name}"] = getattr(r2t.ledger, name).copy()
    groups = runtime.groups
    for group in groups.groups.values():
        if group.group != "sampling":
            state[f"{group.group}.arena"] = group.arena.clone()
            state[f"{group.group}.host_arena"] = group.host_arena.clone()
    return state


def assert_same_state(runtime: GraphRuntime, before: dict[str, Any]) -> None:
    """Bit-identical: NaN payloads and -0.0 included (compared as raw bytes)."""
    after = state_of(runtime)
    changed = [name for name in before if not _same(before[name], after[name])]
    assert changed == [], f"a refused step modified {changed}"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
