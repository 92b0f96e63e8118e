"""The in-graph sampler: logits → one token id per request row (:func:`sample`).

``draw``: what is drawn and the torch code (the CPU path and the oracle); ``kernel`` and
``count``: the fused Triton kernels; ``launch``: their workspace and launches.
"""

from graphrt.runtime.sampler.draw import sample

__all__ = ["sample"]
