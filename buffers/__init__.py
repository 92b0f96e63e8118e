"""Static buffers: declared once, allocated once, viewed per batch-size bucket.

The lowest layer (``graphrt.buffers``): it knows nothing of models, modes or attention.
"""

from graphrt.buffers.spec import BufferSpec, Dims, PadRule
from graphrt.buffers.static import MemoryReport, StaticBuffers

__all__ = ["BufferSpec", "Dims", "MemoryReport", "PadRule", "StaticBuffers"]
