"""Static buffers: declared once, allocated once, viewed per batch-size bucket."""

from graphrt.buffers.spec import BufferSpec, Dims, PadRule
from graphrt.buffers.static import MemoryReport, StaticBuffers

__all__ = ["BufferSpec", "Dims", "MemoryReport", "PadRule", "StaticBuffers"]
