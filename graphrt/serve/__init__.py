"""``graphrt serve``: an OpenAI-compatible server (FastAPI + uvicorn, the ``serve`` extra).

One engine thread (:mod:`.loop`) serves every request with continuous batching; the HTTP
side (:mod:`.app`) speaks OpenAI's protocol (:mod:`.protocol`): ``POST /v1/completions``,
``POST /v1/chat/completions`` (streamed as server-sent events or not), ``GET /v1/models`` and
``GET /health`` (the engine's occupancy). The app module needs FastAPI; the loop does not.
"""

from graphrt.serve.loop import EngineLoop, Job, LoopStats

__all__ = ["EngineLoop", "Job", "LoopStats"]
