"""The one error a damaged or inconsistent checkpoint raises."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: a file cut short, garbage or an absurd
    header (GGUF, safetensors), a ``config.json`` that does not parse or holds impossible sizes,
    a tokenizer that cannot be built, or tensors that do not match the config. The message
    names the file (or the tensor) and the fault."""
