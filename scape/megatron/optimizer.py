"""SCAPE as a Megatron ``DistributedOptimizer``: the masked AdamS step on each owner's shard.

Built by Megatron's own factory (``get_megatron_optimizer``: param groups with Megatron's
weight-decay rules, shard ranges, fp32 main params), then promoted to this subclass, which
replaces the step. Megatron's factory hard-codes its class, hence the promotion (``__class__``
assignment on the instance it built: the subclass adds methods and attributes only).

One step, per rank, after backward has packed and reduce-scattered every bucket
(:mod:`scape.megatron.bucket_group`):

1. ``prepare_grads``: global norm of what was synchronized, from each owner's sum of squares
   in one scalar all-reduce (float64, the simulator's arithmetic); a non-finite local fresh
   gradient on any rank poisons that scalar, so all ranks skip together. A skipped step
   changes nothing: residuals, m, age, masks and params stay as they were.
2. ``step_with_ready_grads``: commit residuals (unsent mass stays, sent entries are zeroed),
   decoupled weight decay on *all* entries by every rank locally, masked AdamS on the owner's
   entries (clipped grad), the owner's next masks and their asynchronous all-gather, then the
   sparse all-gather of the updated entries (now, or overlapped with the next forward).
3. Every ``check_every`` steps, a cross-rank checksum of params and masks; a mismatch raises.

The arithmetic is :mod:`scape.shard`'s, called as the simulator calls it; oracle and product
differ only in transport.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import tensor_parallel
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

from scape.adams import apply_weight_decay_
from scape.config import ScapeConfig
from scape.megatron.bucket_group import promote_bucket_groups
from scape.megatron.dense import OptimizerSpec, megatron_optimizer_config, set_hyperparams
from scape.megatron.layout import bucket_shards, single_buffer
from scape.megatron.state import ScapeState
from scape.shard import clip_coefficient, commit_residual_, owner_update_, update_age_

__all__ = ["ReplicaDivergence", "ScapeDistributedOptimizer", "build_scape_optimizer"]

CHECKS = "consistency_checks"  # byte-counter kind of the checksum all-gather


class ReplicaDivergence(RuntimeError):
    """Data-parallel replicas no longer hold identical params or masks."""


class ScapeDistributedOptimizer(DistributedOptimizer):
    scape: ScapeState

    @classmethod
    def promote(
        cls, dist_opt: DistributedOptimizer, ddp, config: ScapeConfig, *, check_every: int = 100
    ) -> ScapeDistributedOptimizer:
        if type(dist_opt) is not DistributedOptimizer:
            raise TypeError(f"expected Megatron's DistributedOptimizer, got {type(dist_opt)}")
        dist_opt.__class__ = cls
        dist_opt._init_scape(ddp, config, check_every)
        return dist_opt

    # ------------------------------------------------------------------ set-up
    def _init_scape(self, ddp, config: ScapeConfig, check_every: int) -> None:
        buffer = single_buffer(ddp)
        self.ddp, self.check_every = ddp, check_every
        self.param_buffer = buffer.param_data
        self.grad_buffer = buffer.grad_data
        shards = bucket_shards(ddp)
        self.scape = ScapeState(
            config, shards, group=self.data_parallel_group, device=buffer.grad_data.device
        )
        rank = self.scape.rank
        for shard in shards:
            lo, hi = shard.shard_range(rank)
            view = buffer.param_data[lo:hi]
            # fp32 models: Megatron's main params already are views of the param buffer.
            self.scape.main.append(view if view.dtype == torch.float32 else view.float())
        if buffer.param_dtype != torch.float32:
            self._rebind_main_params()
        self._decay_groups = self._param_groups_of_all_params(ddp)
        self._grad_norm = torch.zeros((), dtype=torch.float32)
        promote_bucket_groups(ddp, self.scape)

    def _rebind_main_params(self) -> None:
        """Make Megatron's per-param fp32 main shards views of our contiguous main shards, so
        there is one copy (its model-reload and param-norm helpers stay correct)."""
        rank = self.scape.rank
        for g, (model_group, main_group) in enumerate(
            zip(self.model_float16_groups, self.shard_fp32_from_float16_groups, strict=True)
        ):
            for i, model_param in enumerate(model_group):
                _, _, b = self.model_param_gbuf_map[model_param]
                in_bucket = self._get_model_param_range_map(model_param)["gbuf_world_in_bucket"]
                start = in_bucket.start - rank * self.scape.shards[b].size
                view = self.scape.main[b][start : start + in_bucket.size]
                view.copy_(main_group[i])
                tensor_parallel.copy_tensor_model_parallel_attributes(view, model_param)
                if hasattr(model_param, "shared"):
                    view.shared = model_param.shared
                main_group[i] = view
                model_param.main_param = view
            self.optimizer.param_groups[g]["params"] = [
                *self.shard_fp32_groups[g],
                *self.shard_fp32_from_float16_groups[g],
            ]

    def _param_groups_of_all_params(self, ddp) -> list[tuple[torch.nn.Parameter, int]]:
        """(param, optimizer-group index) for *every* param: each rank applies weight decay to
        all entries. Megatron records groups only for params with a local shard, so ranks
        share theirs once (every param has a shard somewhere)."""
        names = {p: n for n, p in ddp.module.named_parameters()}
        local = {names[p]: g for p, (g, _) in self.model_param_group_index_map.items()}
        gathered: list[dict] = [None] * self.scape.world_size
        dist.all_gather_object(gathered, local, group=self.data_parallel_group)
        merged = {k: v for d in gathered for k, v in d.items()}
        return [(p, merged[n]) for n, p in ddp.module.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ the step
    def _hyperparams(self) -> tuple[float, float, float, float]:
        groups = [g for g in self.optimizer.param_groups if g["params"]]
        lrs = {g["lr"] for g in groups}
        if len(lrs) > 1:
            raise ValueError(f"SCAPE updates a shard with one lr; param groups have {sorted(lrs)}")
        beta1, beta2 = groups[0]["betas"]
        return lrs.pop(), beta1, beta2, groups[0]["eps"]

    @torch.no_grad()
    def prepare_grads(self) -> bool:
        """Global norm of the synchronized values (one scalar all-reduce); True to skip."""
        st = self.scape
        sq = torch.zeros((), dtype=torch.float64, device=st.device)
        for synced in st.synced:
            sq = sq + synced.float().double().square().sum()
        local_finite = torch.isfinite(self.grad_buffer).all()
        sq = torch.where(local_finite, sq, torch.full_like(sq, float("inf")))
        st.comm.all_reduce_sum(sq)
        self._grad_norm = torch.sqrt(sq).float()
        st.step += 1
        if not torch.isfinite(self._grad_norm):
            st.clear_step()  # nothing committed: the next step repacks from intact residuals
            return True
        return False

    def get_grad_norm(self) -> float:
        return float(self._grad_norm)

    @torch.no_grad()
    def step_with_ready_grads(self) -> bool:
        st, cfg, t = self.scape, self.scape.config, self.scape.step
        lr, beta1, beta2, eps = self._hyperparams()
        coeff = clip_coefficient(self._grad_norm, self.config.clip_grad)
        for b, shard in enumerate(st.shards):
            commit_residual_(
                st.residual[shard.start : shard.end],
                self.grad_buffer[shard.start : shard.end],
                st.positions[b],
                st.wires[b],
                world_size=st.world_size,
                error_feedback=cfg.error_feedback,
            )
        self._apply_weight_decay()
        for b in range(len(st.shards)):
            grad = st.synced[b] if coeff is None else st.synced[b] * coeff
            mask = st.used_masks[b][st.rank]
            updated = owner_update_(
                st.main[b], st.exp_avg[b], mask, grad,
                step=t, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                off_mask_momentum=cfg.off_mask_momentum,
            )  # fmt: skip
            update_age_(st.age[b], mask)
            st.param_updates[b] = (updated.to(self.param_buffer.dtype), st.positions[b])
        if cfg.delay_mask and t >= cfg.dense_warmup_steps:
            st.start_next_masks(t + 1)
        if self.check_every and t % self.check_every == 0:
            self.check_consistency()  # before clear_step: it checks this step's masks too
        st.clear_step()
        if not self.ddp_config.overlap_param_gather:
            for model_chunk in self.model_chunks:
                model_chunk.start_param_sync()
        return True

    @torch.no_grad()
    def step(self):
        if self.prepare_grads():
            return False, self.get_grad_norm(), None
        return self.step_with_ready_grads(), self.get_grad_norm(), None

    def _apply_weight_decay(self) -> None:
        """Every rank decays every entry of its replica (a scalar per group, no traffic); the
        owner also decays its separate fp32 main shard (bf16 models)."""
        groups = self.optimizer.param_groups
        for param, g in self._decay_groups:
            apply_weight_decay_(
                param.data, lr=groups[g]["lr"], weight_decay=groups[g]["weight_decay"]
            )
        for g, main_group in enumerate(self.shard_fp32_from_float16_groups):
            for main in main_group:
                apply_weight_decay_(
                    main, lr=groups[g]["lr"], weight_decay=groups[g]["weight_decay"]
                )

    # ------------------------------------------------------------------ consistency
    @torch.no_grad()
    def check_consistency(self) -> None:
        """Cheap cross-rank checksum of the replicated state; raises on any difference.

        Params: the sum of their bit patterns (any changed bit changes it), after completing a
        pending parameter all-gather. Masks: index sums of the masks of this step.
        """
        st = self.scape
        for model_chunk in self.model_chunks:
            model_chunk.start_param_sync(force_sync=True)
        bits = {4: torch.int32, 2: torch.int16}[self.param_buffer.element_size()]
        param_sum = self.param_buffer.view(bits).to(torch.int64).sum()
        mask_sum = torch.zeros((), dtype=torch.int64, device=st.device)
        # The masks of this step (of the last one, between steps), and those for the next step
        # once they have arrived.
        used = st.used_masks if any(m is not None for m in st.used_masks) else st.last_used_masks
        for masks in [*(used or []), *(st.masks or [])]:
            if masks is not None:
                for j, m in enumerate(masks):
                    mask_sum += m.sum() * (j + 1) + m.numel()
        local = torch.stack([param_sum, mask_sum, torch.tensor(st.step, device=st.device)])
        everyone, _ = st.comm.all_gather(local, kind=CHECKS)
        everyone = everyone.view(st.world_size, -1)
        if not bool((everyone == everyone[0]).all()):
            raise ReplicaDivergence(
                f"SCAPE replicas diverged at step {st.step}: per-rank [param bit-sum, mask sum, "
                f"step] = {everyone.tolist()}"
            )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self):
        raise NotImplementedError("SCAPE state is saved with scape.megatron.checkpoint")

    def load_state_dict(self, state_dict):
        raise NotImplementedError("SCAPE state is loaded with scape.megatron.checkpoint")


def build_scape_optimizer(
    ddp,
    spec: OptimizerSpec,
    config: ScapeConfig,
    *,
    bf16: bool = False,
    check_every: int = 100,
) -> ScapeDistributedOptimizer:
    """Megatron's distributed optimizer for ``ddp`` (stock factory), promoted to SCAPE.

    ``spec.kind`` is ignored: SCAPE's update is AdamS (its denominator needs only m and the
    synchronized gradient). ``check_every``: steps between replica checksums (0: never).
    """
    from megatron.core.optimizer import get_megatron_optimizer

    chained = get_megatron_optimizer(megatron_optimizer_config(spec, bf16=bf16), [ddp])
    (dist_opt,) = chained.chained_optimizers
    opt = ScapeDistributedOptimizer.promote(dist_opt, ddp, config, check_every=check_every)
    set_hyperparams(opt, lr=spec.lr, weight_decay=spec.weight_decay)
    return opt
