"""The runtime: capture one graph per (mode, bucket), then run each step as update + replay.

:class:`GraphRuntime` validates a :class:`~graphrt.step.Batch` on the host, writes it into the
metadata groups and replays the graph whose program (:mod:`graphrt.runtime.programs`, one
per mode) runs the device half of the update and the model. Telemetry keeps per-step times.
"""

from graphrt.runtime.capture_setup import make_engine
from graphrt.runtime.errors import GraphFallbackError, HostScalarMismatch, PoisonLeft
from graphrt.runtime.programs import PROGRAMS, ForwardFn, StepEnv
from graphrt.runtime.report import CaptureReport, RuntimeStats
from graphrt.runtime.runtime import GraphRuntime
from graphrt.runtime.telemetry import StepRecord, Telemetry
from graphrt.runtime.tp import TPRuntime, serve

__all__ = [
    "PROGRAMS",
    "CaptureReport",
    "ForwardFn",
    "GraphFallbackError",
    "GraphRuntime",
    "HostScalarMismatch",
    "PoisonLeft",
    "RuntimeStats",
    "StepEnv",
    "StepRecord",
    "TPRuntime",
    "Telemetry",
    "make_engine",
    "serve",
]
