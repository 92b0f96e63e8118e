"""The engine: requests in, tokens out, on top of one runtime (and a draft runtime when speculative).

Host-side scheduling: :class:`Engine` prefills eagerly, decodes through graphs, and with a
draft model runs DRAFT_DECODE → TARGET_VERIFY → DRAFT_EXTEND rounds (:mod:`.speculative`).
:func:`build_stack` assembles a built-in model with its KV cache, request table and runtime.
"""

from graphrt.engine.config import EngineConfig
from graphrt.engine.engine import Engine
from graphrt.engine.request import Request
from graphrt.engine.speculative import SpecOptions
from graphrt.engine.stack import ModelStack, build_stack
from graphrt.engine.stats import EngineStats

__all__ = ["Engine", "EngineConfig", "EngineStats", "ModelStack", "Request", "SpecOptions", "build_stack"]
