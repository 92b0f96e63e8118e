"""The vocabulary of one step: forward modes and the mode table, the batch and its limits, the config.

Host only. A :class:`Batch` holds one step's inputs as numpy arrays and checks them against
:class:`Limits` before anything is written; :data:`MODES` says, per :class:`ForwardMode`, how
many query tokens a request has and everything else that differs between modes.
"""

from graphrt.step.batch import FED, Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.limits import Limits
from graphrt.step.modes import (
    MODES,
    ForwardMode,
    ModeSpec,
    SpecGeometry,
    TreeInput,
    rows_per_req,
    tokens_per_req,
)
from graphrt.step.sampling import SamplingParams

__all__ = [
    "FED",
    "MODES",
    "Batch",
    "ForwardMode",
    "Limits",
    "ModeSpec",
    "RuntimeConfig",
    "SamplingParams",
    "SpecGeometry",
    "TreeInput",
    "rows_per_req",
    "tokens_per_req",
]
