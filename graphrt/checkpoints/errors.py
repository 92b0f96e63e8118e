"""The one error a damaged or inconsistent checkpoint raises, and the JSON read that raises it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: a file cut short, garbage or an absurd
    header (GGUF, safetensors), a ``config.json`` that does not parse or holds impossible sizes,
    a tokenizer that cannot be built, or tensors that do not match the config. The message
    names the file (or the tensor) and the fault."""


def read_json(file: Path) -> Any:
    """A JSON file of a checkpoint; :class:`CheckpointError` naming it when it does not parse."""
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not valid JSON ({err}): cut short or damaged?") from None
    except RecursionError:
        raise CheckpointError(f"{file}: JSON nested too deeply") from None
