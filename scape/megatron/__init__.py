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

Importing this package does not import megatron; the modules do, when used. It does make
megatron-core, when later imported on a host without CUDA, leave its fused ops uncompiled
(:class:`_NoJitFuserWithoutCuda`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class _NoJitFuserWithoutCuda(importlib.abc.MetaPathFinder):
    """Runs ``megatron.core.jit.disable_jit_fuser()`` as soon as that module is loaded, on a
    host without CUDA.

    Why: megatron-core wraps each of its fused ops in ``torch.compile`` while it imports
    (``jit_fuser``), which costs every process ~1.4 s of its ~2.5 s import of megatron-core
    even where nothing is ever compiled. On CPU these fusions are off (our
    ``TransformerConfig`` leaves ``bias_activation_fusion`` and the others at False), so none
    of the wrapped functions runs, and disabling the fuser is megatron's own switch. The
    switch has to act before the fusion modules import ``jit_fuser``, hence a hook on the
    import of ``megatron.core.jit`` rather than a call after ``import megatron.core``.
    """

    NAME = "megatron.core.jit"

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 (importlib's API)
        if name != self.NAME:
            return None
        sys.meta_path.remove(self)  # once: let the other finders find the real module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_disable(module) -> None:  # noqa: ANN001
            exec_module(module)
            import torch

            if not torch.cuda.is_available():
                module.disable_jit_fuser()

        spec.loader.exec_module = exec_then_disable  # type: ignore[method-assign]
        return spec


if "megatron.core.jit" not in sys.modules and not any(
    isinstance(f, _NoJitFuserWithoutCuda) for f in sys.meta_path
):
    sys.meta_path.insert(0, _NoJitFuserWithoutCuda())
