"""Where a command's wall time went, phase by phase, from the process's start."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), None where that cannot be read.

    NOTE: what ``import graphrt`` (torch, mostly) and the interpreter's start cost comes before
    any code of ours runs; the kernel's start time of the process is the only clock for it.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # NOTE: field 22, after pid and comm
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


@dataclass(slots=True)
class Phases:
    """Seconds per phase, in the order added; ``import`` is the time before :meth:`since_process_start`."""

    seconds: dict[str, float] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)

    @classmethod
    def since_process_start(cls) -> Phases:
        age = process_age()
        return cls({"import": age} if age is not None else {})

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = seconds

    def total(self) -> float:
        return self.seconds.get("import", 0.0) + time.perf_counter() - self.start

    def line(self, tokens: int | None = None) -> str:
        """``import 2.1 s · tokenizer 0.4 s · … · decode 1.5 s (31 tokens, 20.7 tok/s) · total 6.5 s``."""
        parts = []
        for name, s in self.seconds.items():
            extra = ""
            if name == "decode" and tokens and s > 0:
                extra = f" ({tokens} tokens, {tokens / s:.1f} tok/s)"
            parts.append(f"{name} {s:.2f} s{extra}")
        return " · ".join([*parts, f"total {self.total():.2f} s"])
