"""SCAPE: sparse, first-moment-masked data-parallel communication for LLM pre-training.

Layers, bottom up (each importable and testable alone):
  adams     the AdamS rule (the dense baseline behind Megatron's distributed optimizer)
  basis     the chunked DCT: top-k per chunk, projection and synthesis at a mask
  config    ScapeConfig: the step's knobs, what is inferred, the chosen defaults
  shard     the SCAPE step for one bucket as pure functions (pack, commit, decode, update)
  comm      the collectives of a step over a process group, with byte counters
  simulate  W data-parallel workers in one process: the oracle for the distributed code
  megatron  the Megatron-Core adapter; peers  the peer baselines as DDP comm hooks

``scape`` is the bottom layer: it imports nothing of ours.
"""

from scape.adams import AdamS, adams_update_

__all__ = ["AdamS", "adams_update_"]
