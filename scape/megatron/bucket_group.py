"""SCAPE's transport inside Megatron's bucket groups.

Megatron's DDP calls ``start_grad_sync`` on a bucket group as soon as backward has produced
all of its grads (overlapping the rest of backward), and ``start_param_sync`` after the
optimizer step (or from the next forward's pre-hook with ``overlap_param_gather``); the
``finish_*`` methods only ``wait()`` on the handles these leave behind. So overriding the two
``start_*`` methods swaps the dense collectives for SCAPE's while Megatron keeps its
scheduling, hooks and overlap unchanged:

* grad sync: pack each bucket's candidate moment at the (already known, one-step-old) masks
  and start the all-reduce of the packed values (or, with ``fuse_buckets``, one all-reduce of
  every bucket once the last is packed); never scale or reduce the whole bucket;
* param sync: nothing travels. Every rank updates every entry itself from the synchronized
  buffer, so the replicas stay identical without a parameter all-gather.

Megatron's DDP builds plain ``_ParamAndGradBucketGroup`` objects inside its constructor
(``partition_buckets``), with no hook to choose the class, and then links them to each other
and to its params (``param_to_bucket_group``, ``next_param_gather_bucket_group``, in 0.19 also
``previous_grad_reduce_bucket_group``; the set grows between releases). So rather than build
new groups and re-link every reference a release keeps, :func:`promote_bucket_groups`
re-classes those very objects to this subclass, before the first step: it overrides two
methods and adds one attribute, and does not define ``__init__`` or change the layout, so
whatever a release's constructor sets up stays as it set it up. (The optimizer, which
Megatron's factory builds by a name we can point at our class, is constructed as SCAPE's.)
"""

from __future__ import annotations

import torch
from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

from scape.megatron.cpu_compat import outside_megatron
from scape.megatron.state import ScapeState, WaitAll
from scape.megatron.versions import refuse_unsupported_ddp_options, wait_for_graph_replayed_grads

__all__ = ["ScapeBucketGroup", "promote_bucket_groups"]


class ScapeBucketGroup(_ParamAndGradBucketGroup):
    scape: ScapeState

    def start_grad_sync(self, force_all_reduce: bool | None = False) -> None:
        if force_all_reduce:
            raise NotImplementedError("SCAPE replaces the gradient reduce-scatter; no all-reduce")
        if self.is_first_batch and self.grad_reduce_handle is not None:
            return  # already dispatched this (first) batch, as in Megatron
        assert self.grad_reduce_handle is None, "one grad sync in flight per bucket group"
        async_op = self.ddp_config.overlap_grad_reduce
        wait_for_graph_replayed_grads(self.params)
        with outside_megatron():
            works = [
                self.scape.start_grad_exchange(b.bucket_id, b.grad_data, async_op=async_op)
                for b in self.buckets
            ]
        self.grad_reduce_handle = WaitAll(works) if async_op else None

    def start_param_sync(self, force_sync: bool = False) -> None:
        # Nothing to gather: every rank already holds the updated params.
        self.param_gather_handle = None
        self.param_gather_dispatched = True


def promote_bucket_groups(ddp, state: ScapeState) -> None:
    """Turn ``ddp``'s bucket groups into :class:`ScapeBucketGroup` sharing ``state``."""
    cfg = ddp.ddp_config
    if not cfg.use_distributed_optimizer or cfg.num_distributed_optimizer_instances != 1:
        raise ValueError("SCAPE needs Megatron's distributed optimizer with one instance")
    # Features whose pre/post-collective steps the overrides below do not perform.
    refuse_unsupported_ddp_options(cfg)
    for buffer in ddp.buffers:
        if buffer.param_dtype == torch.uint8:
            raise ValueError("SCAPE does not support fp8 params")
        for bucket in buffer.buckets:
            if getattr(bucket, "params_with_extra_main_grads", None):
                raise ValueError("SCAPE needs every main_grad inside the grad buffer")
    for group in ddp.bucket_groups + ddp.expert_parallel_bucket_groups:
        if type(group) is not _ParamAndGradBucketGroup and not isinstance(group, ScapeBucketGroup):
            raise TypeError(f"unexpected bucket-group class {type(group).__name__}")
        if group.grad_reduce_handle is not None or group.golden_per_param_grad_ready_counts:
            raise RuntimeError("build the SCAPE optimizer before the first training step")
        group.__class__ = ScapeBucketGroup
        group.scape = state
