"""SCAPE on megatron-core: model builders, dense baselines, the SCAPE DP adapter, CPU support.

Modules (each one job):
  cpu_compat  lets megatron-core's GPTModel, DDP and DistributedOptimizer run on CPU/gloo
  models      GPT-2-style and Llama-style GPTModel shapes, tiny to 1.8B
  dense       DDP + DistributedOptimizer (ZeRO-1) with Megatron's AdamW or our AdamS
  train       one training step (explicit causal mask and positions), used everywhere

Importing this package does not import megatron; the modules do, when used.
"""
