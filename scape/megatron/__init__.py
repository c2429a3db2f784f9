"""SCAPE on megatron-core: model builders, dense baselines, the SCAPE DP adapter, CPU support.

Modules (each one job):
  cpu_compat    lets megatron-core's GPTModel, DDP and DistributedOptimizer run on CPU/gloo
  models        GPT-2-style and Llama-style GPTModel shapes, tiny to 1.8B
  dense         DDP + DistributedOptimizer (ZeRO-1) with Megatron's AdamW or our AdamS
  train         one training step (explicit causal mask and positions), used everywhere
  layout        Megatron's flat buffer / bucket / shard layout (also for the simulator)
  state         one rank's SCAPE state and its sparse exchanges (masks, grads, params)
  bucket_group  Megatron bucket groups whose grad/param syncs are SCAPE's sparse collectives
  optimizer     Megatron DistributedOptimizer subclass: the masked AdamS step, clipping,
                non-finite skip, weight decay, replica checksums
  checkpoint    atomic, validated save/resume of all SCAPE state

Typical use (see ``scape.megatron.train.train_step``)::

    init_megatron(seed)
    config, model = build_gpt_model(SHAPES["gpt-345m"], device="cuda", bf16=True)
    ddp = wrap_ddp(config, model, overlap_param_gather=True)
    opt = build_scape_optimizer(ddp, OptimizerSpec(), ScapeConfig(density=0.01))
    for batch in data: train_step(ddp, opt, batch)

Importing this package does not import megatron; the modules do, when used.
"""
