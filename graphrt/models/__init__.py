"""Model definitions: what runs inside the graph between the metadata update and the output.

A model's forward is ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, vocab]``
and calls ``ctx.attention(layer_id, q, k, v)`` (MHA/GQA), ``ctx.mla`` (dense MLA) or
``ctx.index_topk`` + ``ctx.sparse_mla`` (DSA) per layer; presets name the built-in shapes with
random weights, and :func:`load` builds one from a Hugging Face directory or a GGUF file.
"""

from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.loader import load
from graphrt.models.causal_lm import CausalLM
from graphrt.models.config import ModelConfig
from graphrt.models.llama import TinyLlama
from graphrt.models.mla import MLACausalLM
from graphrt.models.presets import PRESETS, LlamaConfig, MLAConfig, preset

__all__ = [
    "PRESETS",
    "CausalLM",
    "CheckpointError",
    "LlamaConfig",
    "MLACausalLM",
    "MLAConfig",
    "ModelConfig",
    "TinyLlama",
    "load",
    "preset",
]
