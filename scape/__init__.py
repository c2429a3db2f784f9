"""SCAPE: sparse, first-moment-masked data-parallel communication for LLM pre-training.

Layers, bottom up (each importable and testable alone):
  adams     the AdamS rule (dense, foreach, and on gathered index subsets)
  masks     first-moment statistics and exact-k selection per shard
  encoding  mask encodings and their byte sizes
  comm      packing and the sparse collectives over a process group, with byte counters
  simulate  W data-parallel workers in one process: the oracle for the distributed code

``scape`` is the bottom layer: it imports nothing of ours.
"""

from scape.adams import AdamS, adams_update_

__all__ = ["AdamS", "adams_update_"]
