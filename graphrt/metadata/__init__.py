"""The static metadata buffers, one module per group, each with its specs, host write and device derive.

BufferGroups: ``step`` (every mode), ``cascade`` (token trees), ``draft`` (draft steps), ``local``
(chunked-local attention), ``sparse`` (DSA). The host half of an update (``write_*_host``)
runs on the host into a pinned mirror; the device half (``derive*``) runs inside the graph.
:mod:`graphrt.metadata.base` holds the typed views they share; :class:`BufferGroups` owns them all.
"""

from graphrt.metadata.base import CascadeBuffers, StepBuffers, StepMetadata, token_rows
from graphrt.metadata.buffer_groups import BufferGroups, StepInputs
from graphrt.metadata.step import STEP_SPECS, derive, gather_page_table, record_slots, write_host

__all__ = [
    "STEP_SPECS",
    "BufferGroups",
    "CascadeBuffers",
    "StepBuffers",
    "StepInputs",
    "StepMetadata",
    "derive",
    "gather_page_table",
    "record_slots",
    "token_rows",
    "write_host",
]
