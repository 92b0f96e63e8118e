"""Speculation that backs off: which rows draft this step, and the counts of those that did not.

Per step: above ``Backoff.disable_batch_size`` running requests nothing drafts. Per request: a
request drafts when its proposer matches, its gate is open (:mod:`.gate`: its recent guesses,
drafted or not, hit often enough) and it is not paused; each verify it drafted in moves its
acceptance score (an average that halves the weight of older verifies) toward the share of its
offered drafts the target accepted, and a score below ``min_acceptance`` pauses the request for
``backoff_rounds`` steps, after which it starts again from a full score. The pause stays short
(it does not grow with each pause): a request that stops copying and copies again later, as an
edit of given code does, must draft again soon, and the gate keeps a request that never copies
from drafting without pausing it. Rows that do not draft still run in the step: as
verify rows whose drafts are pads (accepted length forced to 0), or, when no row drafts, the
whole step is a DECODE (both graphs are captured, so nothing is recaptured or dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.engine.spec_options import Backoff

#: Weight of a request's newest verify in its acceptance score.
SCORE_WEIGHT = 0.5


@dataclass(slots=True)
class RowBackoff:
    """One request's back-off state: its acceptance score and the steps it still sits out."""

    score: float = 1.0
    paused: int = 0
    pauses: int = 0

    def sits_out(self) -> bool:
        """Whether the request drafts nothing this step (counts the step off a pause)."""
        if self.paused > 0:
            self.paused -= 1
            return True
        return False

    def observe(self, accepted: int, offered: int, policy: Backoff) -> bool:
        """Account one verify that offered ``offered > 0`` drafts; True when it pauses now."""
        self.score += SCORE_WEIGHT * (accepted / offered - self.score)
        if self.score >= policy.min_acceptance:
            return False
        self.paused = policy.backoff_rounds
        self.pauses, self.score = self.pauses + 1, 1.0
        return True


@dataclass(slots=True)
class BackoffCounts:
    """Why drafts were not made, counted over an engine's life.

    ``decode_steps``: steps run as DECODE since no row drafted; ``batch_steps``: of those,
    steps above ``disable_batch_size``; ``paused_rows`` / ``no_match_rows``: request-steps
    without drafts because the request was paused / its proposer found no match or its gate
    was closed;
    ``pad_rows``: verify rows that carried pad drafts; ``pauses``: pauses begun;
    ``stale_rows``: overlapped rounds' rows dropped because the round before them accepted
    fewer drafts than they assumed (:mod:`.spec_ahead`).
    """

    decode_steps: int = 0
    batch_steps: int = 0
    paused_rows: int = 0
    no_match_rows: int = 0
    pad_rows: int = 0
    pauses: int = 0
    stale_rows: int = 0
    #: Tokens committed and request-steps, over verify and backed-off DECODE steps alike.
    committed: int = 0
    request_steps: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "decode_steps": self.decode_steps,
            "batch_steps": self.batch_steps,
            "paused_rows": self.paused_rows,
            "no_match_rows": self.no_match_rows,
            "pad_rows": self.pad_rows,
            "pauses": self.pauses,
            "stale_rows": self.stale_rows,
        }

    @property
    def tokens_per_round(self) -> float:
        """Tokens committed per request per step (1.0: no gain over plain decoding)."""
        return self.committed / self.request_steps if self.request_steps else 0.0
