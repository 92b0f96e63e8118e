"""Checkpoints: Hugging Face safetensors directories, GGUF files and packaged models, read into
the model definitions of :mod:`graphrt.models` (config parsing, tensor mapping and checks, the
conversion cache).

:func:`load` builds a model from a checkpoint; :class:`CheckpointError` names a damaged one.
"""

from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.loader import load

__all__ = ["CheckpointError", "load"]
