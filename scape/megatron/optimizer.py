"""SCAPE as a Megatron ``DistributedOptimizer``: every rank steps every entry from the one
synchronized sparse buffer.

Built by Megatron's own factory (``get_megatron_optimizer``: param groups with Megatron's
weight-decay rules, the buffer layout with its buckets and shards), untouched: the
``DistributedOptimizer`` it returns is then re-classed to this subclass, as the bucket groups
are (:mod:`scape.megatron.bucket_group`), so whatever a release's constructor sets up stays as
it set it up and no module global of Megatron's is ever replaced. The subclass replaces the
step. Megatron's inner optimizer is not used, and its per-shard fp32 main params become views
of SCAPE's: SCAPE's state is :class:`scape.megatron.state.ScapeState`.

Checkpoints, as Megatron's optimizers own them: :meth:`state_dict` / :meth:`load_state_dict`
(this rank's state, for per-rank files: the pretrain stage's) and :meth:`sharded_state_dict`
(for Megatron's distributed checkpointing: the rank's own moment as its shard of a (W*N,)
tensor, the replicated second moment, fp32 params and masks saved once, the counters and
the configuration as common state; :func:`scape.megatron.checkpoint.save_distributed`).

One step, per rank, after backward has packed every bucket and its all-reduce has finished
(:mod:`scape.megatron.bucket_group`):

1. ``prepare_grads``: the summed buffer carries every rank's finite flag, so all ranks see
   the same verdict with no extra collective; a skipped step changes nothing (moments,
   second moment, masks and params stay as they were).
2. ``step_with_ready_grads``: bucket by bucket, each rank removes what it sent from its
   moment, decodes the buffer into q (the same on every rank), applies decoupled weight decay
   and the update to every entry of its fp32 params, writes them into the model's param
   buffer, and makes the mask of the shard it owns for the next step; then it starts the
   masks' all-gather. (One :class:`scape.step.BucketStep` call per bucket: ``finish``.)
3. Every ``check_every`` steps, a cross-rank checksum of params and masks; a mismatch raises.

The arithmetic is :mod:`scape.step`'s, called as the simulator calls it; oracle and product
differ only in transport. Megatron's per-shard fp32 main params become views of SCAPE's fp32
params (``main``), so they hold no memory of their own and show what SCAPE steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

from scape.config import ScapeConfig
from scape.megatron.bucket_group import promote_bucket_groups
from scape.megatron.cpu_compat import outside_megatron
from scape.megatron.dense import OptimizerSpec, megatron_optimizer_config, set_hyperparams
from scape.megatron.layout import bucket_shards, single_buffer
from scape.megatron.replicas import ReplicaDivergence
from scape.megatron.state import ScapeState
from scape.shard import decay_runs, runs_within
from scape.step import Update, step_clip

__all__ = ["ReplicaDivergence", "ScapeDistributedOptimizer", "build_scape_optimizer"]

CHECKS = "consistency_checks"  # byte-counter kind of the checksum all-gather


class ScapeDistributedOptimizer(DistributedOptimizer):
    """Constructed by Megatron's factory with ``DistributedOptimizer``'s own arguments (see
    :func:`build_scape_optimizer`); :meth:`init_scape` then attaches SCAPE's state."""

    scape: ScapeState

    # ------------------------------------------------------------------ set-up
    def init_scape(
        self, ddp, config: ScapeConfig, check_every: int, implementation: str | None = None
    ) -> None:
        buffer = single_buffer(ddp)
        self.ddp, self.check_every = ddp, check_every
        self.param_buffer = buffer.param_data
        self.grad_buffer = buffer.grad_data
        shards = bucket_shards(ddp)
        # weight decay's runs of entries, bucket by bucket and relative to each bucket (the
        # buckets tile the buffer: see ScapeState)
        runs = decay_runs(self._weight_decay_mask(ddp, buffer))
        self.scape = ScapeState(
            config,
            shards,
            group=self.data_parallel_group,
            device=buffer.grad_data.device,
            grad_buffer=buffer.grad_data,
            decay_runs=[runs_within(runs, s.start, s.end) for s in shards],
            eps=self._eps(),
            implementation=implementation,
        )
        # fp32 models: the param buffer is the fp32 copy every rank updates; bf16 models keep
        # a separate fp32 copy of every entry (replicated, like the moment), which Megatron's
        # shard main params then view instead of holding copies of their own.
        if buffer.param_data.dtype == torch.float32:
            self.scape.main = buffer.param_data
        else:
            self._release_main_params()
            self.scape.main = buffer.param_data.float()
            self._view_main_params(self.scape.main)
        self._grad_norm = torch.zeros((), dtype=torch.float32)
        promote_bucket_groups(ddp, self.scape)

    def _shard_main_params(self) -> list[tuple]:
        """(model param, its fp32 shard main param) for this rank's bf16 params."""
        return [
            (model_param, main_param)
            for models, mains in zip(self.model_float16_groups,
                                     self.shard_fp32_from_float16_groups, strict=True)
            for model_param, main_param in zip(models, mains, strict=True)
        ]  # fmt: skip

    def _release_main_params(self) -> None:
        """Free Megatron's fp32 copies of this rank's shard before SCAPE's own is allocated,
        so the two never coexist (the peak would count both)."""
        for _, main_param in self._shard_main_params():
            main_param.data = main_param.data.new_empty(0)

    def _view_main_params(self, main: torch.Tensor) -> None:
        """Point Megatron's fp32 shard main params at the same entries of SCAPE's ``main``."""
        for model_param, main_param in self._shard_main_params():
            where = self._get_model_param_range_map(model_param)["gbuf_world"]
            main_param.data = main[where.start : where.end]

    def _weight_decay_mask(self, ddp, buffer) -> torch.Tensor:
        """Buffer entries weight decay applies to: params of groups whose ``wd_mult`` is not 0
        (Megatron's rule: not biases or norm weights). Every rank needs it for every param,
        but Megatron records groups only for params with a local shard, so ranks share theirs
        once (every param has a shard somewhere)."""
        names = {p: n for n, p in ddp.module.named_parameters()}
        groups = self.optimizer.param_groups
        local = {
            names[p]: groups[g].get("wd_mult", 1.0) != 0.0
            for p, (g, _) in self.model_param_group_index_map.items()
        }
        gathered: list[dict] = [None] * dist.get_world_size(self.data_parallel_group)
        dist.all_gather_object(gathered, local, group=self.data_parallel_group)
        decays = {k: v for d in gathered for k, v in d.items()}
        mask = torch.zeros(buffer.numel, dtype=torch.bool, device=buffer.param_data.device)
        for name, p in ddp.module.named_parameters():
            if p.requires_grad and decays[name]:
                start, end, _ = buffer.param_index_map[p]
                mask[start:end] = True
        return mask

    # ------------------------------------------------------------------ the step
    def _lr_and_weight_decay(self) -> tuple[float, float]:
        """The one lr and the one weight decay of the decayed groups, as the scheduler set them."""
        groups = [g for g in self.optimizer.param_groups if g["params"]]
        lrs = {g["lr"] for g in groups}
        decays = {g["weight_decay"] for g in groups if g.get("wd_mult", 1.0) != 0.0}
        if len(lrs) > 1 or len(decays) > 1:
            raise ValueError(
                f"SCAPE steps every entry with one lr and one weight decay; param groups "
                f"have lr {sorted(lrs)}, weight decay {sorted(decays)}"
            )
        return lrs.pop(), decays.pop() if decays else 0.0

    def _eps(self) -> float:
        return next(g for g in self.optimizer.param_groups if g["params"])["eps"]

    @torch.no_grad()
    @outside_megatron()
    def prepare_grads(self) -> bool:
        """Whether to skip this step: any rank's non-finite gradient or any non-finite value
        in the summed buffer (the flags travel inside it)."""
        st = self.scape
        st.step += 1
        if not st.step_is_finite():
            self._grad_norm = torch.tensor(float("nan"))
            st.clear_step()  # nothing committed: the next step packs from intact moments
            return True
        return False

    def get_grad_norm(self) -> float:
        return float(self._grad_norm)

    @torch.no_grad()
    @outside_megatron()
    def step_with_ready_grads(self) -> bool:
        st, cfg = self.scape, self.scape.config
        lr, weight_decay = self._lr_and_weight_decay()
        dense = st.step_is_dense()
        st.updates += 1
        # ||q|| over every bucket, before clipping, off the summed buffers (the same on every
        # rank, no collective); clipped by Megatron's clip_grad, as the dense arm's gradient
        norm, clip = step_clip(st.synced_all(), self.config.clip_grad, st.implementation)
        # From the last warm-up step on, each rank makes its own shards' masks for the next
        # step (prepare_grads has counted this step: st.step is its number).
        make_masks = st.step >= cfg.dense_warmup_steps
        separate = st.main.data_ptr() != self.param_buffer.data_ptr()  # bf16 model params
        for b, shard in enumerate(st.shards):
            span = slice(shard.start, shard.end)
            update = Update(
                param=st.main[span],
                second_moment=None if st.second_moment is None else st.second_moment[span],
                param_out=self.param_buffer[span] if separate else None,
                decay_factor=1.0 - lr * weight_decay, lr=lr, step=st.updates, clip=clip,
            )  # fmt: skip
            st.steps[b].finish(
                st.moment[span], self.grad_buffer[span], None if dense else st.masks[b],
                st.synced(b), update=update, next_mask=st.next_mask_out(b) if make_masks else None,
            )  # fmt: skip
        self._grad_norm = norm
        st.last_used_masks = None if dense else st.masks
        if make_masks:
            st.start_mask_exchange()
        if self.check_every and st.step % self.check_every == 0:
            self.check_consistency()
        st.clear_step()
        return True

    @torch.no_grad()
    def step(self):
        if self.prepare_grads():
            return False, self.get_grad_norm(), None
        return self.step_with_ready_grads(), self.get_grad_norm(), None

    # ------------------------------------------------------------------ consistency
    @torch.no_grad()
    def check_consistency(self) -> None:
        """Cheap cross-rank checksum of the replicated state; raises on any difference.

        Params: the sum of the bit patterns of the model's params and of the fp32 copy every
        rank updates (any changed bit changes it). Masks: weighted offset sums of the masks
        used at this step and of those for the next one.
        """
        st = self.scape
        bits = {4: torch.int32, 2: torch.int16}[self.param_buffer.element_size()]
        param_sum = self.param_buffer.view(bits).to(torch.int64).sum()
        main_sum = st.main.view(torch.int32).to(torch.int64).sum()
        st.finish_mask_exchange()  # the next step's masks, in flight since the step's end
        mask_sum = torch.zeros((), dtype=torch.int64, device=st.device)
        weights = torch.arange(1, st.world_size + 1, device=st.device).unsqueeze(1)
        for masks in [*(st.last_used_masks or []), *(st.masks or [])]:
            mask_sum += (masks * weights).sum() + masks.numel()
        param_sum = param_sum + main_sum
        local = torch.stack([param_sum, mask_sum, torch.tensor(st.step, device=st.device)])
        everyone, _ = st.comm.all_gather(local, kind=CHECKS)
        everyone = everyone.view(st.world_size, -1)
        if not bool((everyone == everyone[0]).all()):
            raise ReplicaDivergence(
                f"SCAPE replicas diverged at step {st.step}: per-rank [param bit-sum, mask sum, "
                f"step] = {everyone.tolist()}"
            )

    def sent_bytes(self) -> dict[str, float]:
        """Bytes this rank has sent since it was built, by kind of traffic (its collectives'
        own counters)."""
        return self.scape.comm.counter.snapshot()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory) -> dict:
        """For a trainer's checkpoint (collective): SCAPE's state through Megatron's
        distributed checkpointing under ``directory``; nothing is left for the rank's file."""
        from scape.megatron.checkpoint import save_distributed

        save_distributed(directory, self)
        return {}

    def load_checkpoint(self, directory, rank_part: dict) -> None:
        """Restore :meth:`save_checkpoint`'s (collective); another world size or configuration
        fails with a one-line :class:`~scape.megatron.checkpoint.CheckpointMismatch`."""
        from scape.megatron.checkpoint import load_distributed

        del rank_part
        load_distributed(directory, self)

    def state_dict(self) -> dict:
        """This rank's SCAPE state (:func:`scape.megatron.checkpoint.scape_state_dict`)."""
        from scape.megatron.checkpoint import scape_state_dict

        return scape_state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`'s output, or the tensors Megatron's distributed
        checkpointing loaded into :meth:`sharded_state_dict` (validated: another world size,
        configuration or layout fails with a one-line :class:`CheckpointMismatch`)."""
        from scape.megatron.checkpoint import load_scape_state_dict, load_sharded

        if "format" in state_dict:
            load_scape_state_dict(self, state_dict)
        else:
            load_sharded(self, state_dict)

    def sharded_state_dict(self, model_sharded_state_dict=None, is_loading: bool = False,
                           **kwargs) -> dict:  # fmt: skip
        """SCAPE's state for Megatron's distributed checkpointing (see the module docstring);
        with ``is_loading`` the same keys over tensors to load into."""
        from scape.megatron.checkpoint import sharded_state

        return sharded_state(self, is_loading=is_loading)


def build_scape_optimizer(
    ddp,
    spec: OptimizerSpec,
    config: ScapeConfig,
    *,
    bf16: bool = False,
    check_every: int = 100,
    implementation: str | None = None,
) -> ScapeDistributedOptimizer:
    """Megatron's distributed optimizer for ``ddp``, built by the stock factory as SCAPE's.

    SCAPE reads ``spec``'s lr, weight decay, eps and clip_grad only: its update is not
    AdamS but ``config.update``'s (``rms``: q over the root of a second moment rebuilt from q,
    RMSprop-like; ``sign``: sign(q)), with ``config``'s own betas, so ``spec.kind``, beta1 and
    beta2 are ignored. ``check_every``: steps between replica checksums (0: never).
    ``implementation``: :mod:`scape.step`'s (None: by device, the fused kernels on CUDA).
    """
    from megatron.core.optimizer import get_megatron_optimizer

    chained = get_megatron_optimizer(megatron_optimizer_config(spec, bf16=bf16), [ddp])
    (opt,) = chained.chained_optimizers
    if type(opt) is not DistributedOptimizer:
        raise TypeError(
            f"megatron-core's get_megatron_optimizer built {type(opt).__name__}, not its "
            "DistributedOptimizer: SCAPE needs the distributed optimizer (ZeRO-1 layout); see "
            "scape/megatron/versions.py for the tested versions"
        )
    opt.__class__ = ScapeDistributedOptimizer  # adds SCAPE's step and state, keeps Megatron's
    opt.init_scape(ddp, config, check_every, implementation)
    set_hyperparams(opt, lr=spec.lr, weight_decay=spec.weight_decay)
    return opt
