"""Graphs per (mode, bucket): bucket policy, dispatch, and the CUDA and emulated engines.

The lowest layer beside ``graphrt.buffers``: a graph key is opaque here, and nothing of
models or attention is imported.
"""

from graphrt.capture.buckets import BucketPolicy, default_buckets, optimal_buckets, padded_tokens
from graphrt.capture.dispatch import Dispatcher, Fallback, Pending
from graphrt.capture.emulated import CaptureSyncError, EmulatedEngine
from graphrt.capture.graph import CaptureEngine, Graph, GraphInfo, KernelCount, SplitGraph
from graphrt.capture.topology import GraphTopology, TopologyNode

__all__ = [
    "BucketPolicy",
    "CaptureEngine",
    "CaptureSyncError",
    "Dispatcher",
    "EmulatedEngine",
    "Fallback",
    "Graph",
    "GraphInfo",
    "GraphTopology",
    "KernelCount",
    "Pending",
    "SplitGraph",
    "TopologyNode",
    "default_buckets",
    "optimal_buckets",
    "padded_tokens",
]
