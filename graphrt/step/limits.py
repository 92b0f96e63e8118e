"""What a batch is checked against, and the model facts the runtime reads them from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graphrt.step.checks import Scratch
from graphrt.step.modes import SpecGeometry


@dataclass(frozen=True, slots=True)
class Limits:
    """What a batch is checked against before anything is written."""

    max_reqs: int
    max_context_len: int
    page_size: int
    num_live_slots: int
    vocab_size: int | None = None
    speculative: SpecGeometry | None = None
    #: The runtime has a cascade group: TARGET_VERIFY batches are token trees.
    tree: bool = False
    #: The runtime has a sampling group (``RuntimeConfig(sample=True)``).
    sample: bool = False
    #: Reusable arrays of the fast check (not part of the limits' value).
    scratch: Scratch = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scratch", Scratch(self.max_reqs, self.num_live_slots, self.page_size))


def model_vocab_size(forward: Any) -> int | None:
    """The vocabulary a forward embeds: its ``vocab_size``, else its first ``nn.Embedding``.

    Looks at ``forward`` and, for a bound method, its object. None when neither says.
    """
    for owner in (forward, getattr(forward, "__self__", None)):
        size = getattr(owner, "vocab_size", None)
        if isinstance(size, int) and size > 0:
            return size
        if isinstance(owner, torch.nn.Module):
            embedding = next((m for m in owner.modules() if isinstance(m, torch.nn.Embedding)), None)
            if embedding is not None:
                return int(embedding.num_embeddings)
    return None


def needs_vocab(option: str, vocab_size: int | None) -> int:
    """``vocab_size`` for ``RuntimeConfig.<option>``, whose tables keep a column per token id;
    a ValueError naming the option when the model's vocabulary is unknown (None)."""
    if vocab_size is None:
        raise ValueError(f"{option}=True needs the model's vocab_size (pass vocab_size=)")
    return vocab_size
