"""Peer baselines as DDP communication hooks, each counting its bytes like ``scape.comm``.

  dgc       DGC-style top-k of the accumulated gradient with momentum correction
  onebit    1-bit-Adam-style sign-compressed momentum, and its optimizer
  powersgd  torch's PowerSGD hook, counted
  buckets   per-parameter hook state that follows DDP's bucket rebuilds

Register with ``ddp.register_comm_hook(h, type(h).hook)``; ``h.counter`` holds the bytes.
"""

from scape.peers.dgc import DGCConfig, DGCHook
from scape.peers.onebit import OneBitAdam, OneBitConfig, OneBitHook
from scape.peers.powersgd import CountedPowerSGD, PowerSGDConfig

__all__ = [
    "CountedPowerSGD",
    "DGCConfig",
    "DGCHook",
    "OneBitAdam",
    "OneBitConfig",
    "OneBitHook",
    "PowerSGDConfig",
]
