"""SCAPE on megatron-core: model builders, dense baselines, the SCAPE DP adapter, CPU support.

Modules (each one job):
  cpu_compat    lets megatron-core's GPTModel, DDP and DistributedOptimizer run on CPU/gloo
  models        GPT-2-style and Llama-style GPTModel shapes, tiny to 1.8B
  dense         DDP + DistributedOptimizer (ZeRO-1) with Megatron's AdamW or our AdamS
  train         one training step (explicit causal mask and positions), used everywhere
  layout        Megatron's flat buffer / bucket / shard layout (also for the simulator)
  state         one rank's SCAPE state and its exchanges (the shared buffer, the masks)
  bucket_group  Megatron bucket groups whose grad sync is SCAPE's all-reduce of packed
                values (and whose param sync has nothing left to do)
  optimizer     Megatron DistributedOptimizer subclass: every rank's update of every entry
                from the shared buffer, non-finite skip, weight decay, replica checksums
  checkpoint    atomic, validated save/resume of all SCAPE state
  versions      where the tested megatron-core releases (0.16.1, 0.19.2) differ, in one place

Typical use (see ``scape.megatron.train.train_step``)::

    init_megatron(seed)
    config, model = build_gpt_model(SHAPES["gpt-345m"], device="cuda", bf16=True)
    ddp = wrap_ddp(config, model)
    opt = build_scape_optimizer(ddp, OptimizerSpec(), ScapeConfig(chunk=100, k=1))
    for batch in data: train_step(ddp, opt, batch)

Importing this package does not import megatron; the modules do, when used.
"""
