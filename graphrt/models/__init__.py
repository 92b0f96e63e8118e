"""Built-in models."""

from graphrt.models.llama import TinyLlama
from graphrt.models.presets import PRESETS, LlamaConfig, preset

__all__ = ["PRESETS", "LlamaConfig", "TinyLlama", "preset"]
