"""Built-in models and checkpoint loading (``load``: Hugging Face directories and GGUF files)."""

from graphrt.models.causal_lm import CausalLM
from graphrt.models.checkpoint import CheckpointError
from graphrt.models.hf_config import ModelConfig
from graphrt.models.llama import TinyLlama
from graphrt.models.loader import load
from graphrt.models.presets import PRESETS, LlamaConfig, preset

__all__ = [
    "PRESETS",
    "CausalLM",
    "CheckpointError",
    "LlamaConfig",
    "ModelConfig",
    "TinyLlama",
    "load",
    "preset",
]
