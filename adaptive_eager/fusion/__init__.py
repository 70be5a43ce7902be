"""Pure graph work: the micro-graph IR, regions, support and cost policies, the partitioner.

Nothing here imports the dispatch machinery or a compile backend.
"""

from .ir import OpNode, TensorSpec, ValueRef, Window, map_refs

__all__ = ["OpNode", "TensorSpec", "ValueRef", "Window", "map_refs"]
