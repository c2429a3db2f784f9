"""Save and resume all SCAPE state of a Megatron run, bit-identically.

One file per rank (``scape_rank00000.pt``, ...) holding what that rank alone knows: the step
counters, its own first moment, the replicated second moment and fp32 params, the model's
param buffer, the masks for the next step (identical on all ranks; the in-flight mask
all-gather is completed first) and its RNG states. Each file is written to a temporary name
in the same directory, fsynced and renamed, so a crash never leaves a half-written
checkpoint under the real name. Loading uses ``torch.load(weights_only=True)`` and refuses,
with a message naming the field, a checkpoint from another world size, rank, SCAPE
configuration or buffer layout.

The same state also goes through Megatron's distributed checkpointing
(:func:`save_distributed` / :func:`load_distributed`, the optimizer's ``sharded_state_dict``),
which the pretrain stage's checkpoints use. Data-loader position and LR schedule belong to
the caller.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "CheckpointMismatch",
    "load_distributed",
    "load_scape_checkpoint",
    "load_scape_state_dict",
    "load_sharded",
    "save_distributed",
    "save_scape_checkpoint",
    "scape_state_dict",
    "sharded_state",
]

FORMAT = "scape-megatron/2"  # 2: local moments and one shared buffer (1 was the masked-AdamS step)
TRANSPORT_ONLY = ("fuse_buckets",)  # config fields that do not change the numbers


def _rank_file(directory: Path, rank: int) -> Path:
    return directory / f"scape_rank{rank:05d}.pt"


class CheckpointMismatch(ValueError):
    """The checkpoint does not belong to this run (world size, layout, sparsity, ...)."""


def _layout(opt) -> dict:
    st = opt.scape
    return {
        "buckets": [[s.start, s.end] for s in st.shards],
        "param_dtype": str(opt.param_buffer.dtype),
    }


def scape_state_dict(opt) -> dict:
    """This rank's SCAPE state (CPU copies), after completing the mask exchange in flight.

    Plain tensors, lists, dicts and numbers only, so ``torch.load(weights_only=True)`` reads it;
    the optimizer's ``state_dict`` and :func:`save_scape_checkpoint`.
    """
    st = opt.scape
    st.finish_mask_exchange()
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    state = {
        "format": FORMAT,
        "world_size": st.world_size,
        "rank": st.rank,
        "config": dataclasses.asdict(st.config),
        "layout": _layout(opt),
        "step": st.step,
        "updates": st.updates,
        "moment": st.moment,
        "second_moment": st.second_moment,
        "main": st.main,
        "param_buffer": opt.param_buffer,
        "masks": None if st.masks is None else [m.long() for m in st.masks],
        "mask_k": st.mask_k,  # a density ramp's masks change size with k
        "rng": rng,
        "bytes": st.comm.counter.snapshot(),  # informative; counters restart on resume
    }
    return {k: _to_cpu(v) for k, v in state.items()}


def save_scape_checkpoint(directory: str | os.PathLike, opt) -> Path:
    """Every rank writes its file atomically; returns once all ranks have written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = scape_state_dict(opt)
    target = _rank_file(directory, opt.scape.rank)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dist.barrier(group=opt.data_parallel_group)
    return target


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, list | tuple):
        return [_to_cpu(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckpointMismatch(f"SCAPE checkpoint does not match this run: {what}")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype


def _check_config(saved: dict, now: dict) -> None:
    """Every ScapeConfig field that changes the numbers the same (transport may differ)."""
    diff = {k: (saved.get(k), v) for k, v in now.items()
            if saved.get(k) != v and k not in TRANSPORT_ONLY}  # fmt: skip
    _check(not diff, f"ScapeConfig fields differ (saved, now): {diff}")


def _validate(state: dict, opt) -> None:
    st = opt.scape
    _check(state.get("format") == FORMAT, f"format {state.get('format')!r}, expected {FORMAT!r}")
    _check(
        state["world_size"] == st.world_size,
        f"saved with {state['world_size']} data-parallel ranks, this run has {st.world_size}",
    )
    _check(state["rank"] == st.rank, f"file of rank {state['rank']} loaded on rank {st.rank}")
    saved_cfg, cfg = state["config"], dataclasses.asdict(st.config)
    _check(
        (saved_cfg.get("chunk"), saved_cfg.get("k")) == (cfg["chunk"], cfg["k"]),
        f"{saved_cfg.get('k')} of every {saved_cfg.get('chunk')} coefficients saved, this run "
        f"sends {cfg['k']} of every {cfg['chunk']} (sparsity {st.config.sparsity:.4g})",
    )
    _check_config(saved_cfg, cfg)
    _check(
        state["layout"] == _layout(opt),
        f"buffer layout {state['layout']} saved, this run has {_layout(opt)}",
    )
    for name, now in (
        ("moment", st.moment),
        ("second_moment", st.second_moment),
        ("main", st.main),
        ("param_buffer", opt.param_buffer),
    ):
        _check(_same(state[name], now), f"{name} differs in shape or dtype")
    masks, k = state["masks"], int(state.get("mask_k", st.config.k))
    if masks is not None:
        _check(len(masks) == len(st.shards), "masks for a different number of buckets")
        chunk = st.config.chunk
        for b, m in enumerate(masks):
            n = st.mask_count(b, k)
            _check(
                m.dtype == torch.int64
                and tuple(m.shape) == (st.world_size, n)
                and int(m.min()) >= 0
                and int(m.max()) < chunk,
                f"bucket {b}: masks are not {st.world_size} x {n} chunk offsets in [0, {chunk})",
            )


def load_scape_checkpoint(directory: str | os.PathLike, opt) -> int:
    """Restore this rank's SCAPE state from ``directory``; returns the step it was saved at."""
    path = _rank_file(Path(directory), opt.scape.rank)
    if not path.is_file():
        raise FileNotFoundError(f"no SCAPE checkpoint for rank {opt.scape.rank} at {path}")
    return load_scape_state_dict(opt, torch.load(path, map_location="cpu", weights_only=True))


def load_scape_state_dict(opt, state: dict) -> int:
    """Restore from :func:`scape_state_dict`'s output (validated first); returns its step.

    Collective: the replicas are checksummed across ranks afterwards, so a mixed-up set of
    per-rank states fails here rather than training on diverged replicas.
    """
    st = opt.scape
    _validate(state, opt)
    st.finish_mask_exchange()  # nothing may land after the restore
    with torch.no_grad():
        st.moment.copy_(state["moment"])
        if st.second_moment is not None:
            st.second_moment.copy_(state["second_moment"])
        opt.param_buffer.copy_(state["param_buffer"])
        if st.main.data_ptr() != opt.param_buffer.data_ptr():
            st.main.copy_(state["main"])
    st.step, st.updates = int(state["step"]), int(state["updates"])
    st.set_masks(state["masks"], int(state.get("mask_k", st.config.k)))
    st.clear_step()
    torch.set_rng_state(state["rng"]["cpu"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["rng"]["cuda"])
    opt.check_consistency()
    return st.step


# ---------------------------------------------------------------------- Megatron's checkpoints
SHARDED_PREFIX = "optimizer.scape."


def _common(opt) -> dict:
    """What every rank shares and a sharded checkpoint keeps once: the run's identity."""
    st = opt.scape
    return {"format": FORMAT, "world_size": st.world_size, "config": dataclasses.asdict(st.config),
            "layout": _layout(opt)}  # fmt: skip


def sharded_state(opt, *, is_loading: bool = False) -> dict:
    """:meth:`ScapeDistributedOptimizer.sharded_state_dict`: Megatron ``ShardedTensor`` s for
    the rank's own moment (its shard of a (W*N,) tensor: another world size cannot load it),
    the replicated second moment, fp32 params and masks (written by rank 0's replica), and
    the counters, configuration and layout as common state. With ``is_loading`` the same
    keys over fresh tensors to load into."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    st = opt.scape
    st.finish_mask_exchange()
    rank, world = st.rank, st.world_size

    def own(key: str, tensor: torch.Tensor) -> ShardedTensor:
        data = torch.empty_like(tensor) if is_loading else tensor
        return ShardedTensor.from_rank_offsets(SHARDED_PREFIX + key, data, (0, rank, world))

    def shared(key: str, tensor: torch.Tensor) -> ShardedTensor:
        data = torch.empty_like(tensor) if is_loading else tensor.contiguous()
        return ShardedTensor.from_rank_offsets(SHARDED_PREFIX + key, data, replica_id=rank)

    # Masks saved at the largest k's size (a ramp's change with k), the first columns of each
    # row at mask_k's: the tensors to load into have one shape whatever step was saved.
    k_max = max(st.config.k_levels)
    masks = [torch.zeros(world, st.mask_count(b, k_max), dtype=torch.int64, device=st.device)
             for b in range(len(st.shards))]  # fmt: skip
    if st.masks is not None and not is_loading:
        for padded, m in zip(masks, st.masks, strict=True):
            padded[:, : m.shape[1]].copy_(m)
    state = {
        "moment": own("moment", st.moment),
        "main": shared("main", st.main),
        "masks": [shared(f"masks.{b}", m) for b, m in enumerate(masks)],
        "has_masks": st.masks is not None,
        "mask_k": st.mask_k,
        "step": st.step,
        "updates": st.updates,
        "common": _common(opt),
    }
    if st.second_moment is not None:
        state["second_moment"] = shared("second_moment", st.second_moment)
    return state


def load_sharded(opt, state: dict) -> None:
    """Restore what Megatron's distributed checkpointing loaded into :func:`sharded_state`
    (its tensors filled, its common values read back), checked against this run first."""
    st = opt.scape
    saved, now = state["common"], _common(opt)
    _check(saved.get("format") == FORMAT, f"format {saved.get('format')!r}, expected {FORMAT!r}")
    _check(saved["world_size"] == now["world_size"],
           f"saved with {saved['world_size']} data-parallel ranks, this run has "
           f"{now['world_size']}; SCAPE's per-rank moments do not reshard")  # fmt: skip
    _check_config(saved["config"], now["config"])
    _check(saved["layout"] == now["layout"],
           f"buffer layout {saved['layout']} saved, this run has {now['layout']}")  # fmt: skip
    with torch.no_grad():
        st.moment.copy_(state["moment"])
        if st.second_moment is not None:
            st.second_moment.copy_(state["second_moment"])
        st.main.copy_(state["main"])
        if st.main.data_ptr() != opt.param_buffer.data_ptr():
            opt.param_buffer.copy_(st.main)  # the model's params are the fp32 ones rounded
    st.step, st.updates = int(state["step"]), int(state["updates"])
    k = int(state.get("mask_k", st.config.k))
    masks = [m[:, : st.mask_count(b, k)] for b, m in enumerate(state["masks"])]
    st.set_masks(masks if state["has_masks"] else None, k)
    st.clear_step()
    opt.check_consistency()


def _in_process_write_results() -> None:
    """Give megatron's checkpoint writer an in-process queue for its write results.

    Its ``torch_dist`` strategy hands every save's results back through one module-level
    queue, made on first use as ``mp.get_context("spawn").Manager().Queue()``: a server
    process, spawned by every rank, that imports the rank's ``__main__`` again (2-3 s of each
    rank's first save, longer than the save of a small model). Our saves are synchronous
    (``dist_checkpointing.save`` without ``async_sharded_save``): the results are put and read
    in the saving process itself, so a plain ``queue.Queue`` carries them. Left alone when it
    exists already or the release keeps it elsewhere."""
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:
        return
    if getattr(filesystem_async, "_results_queue", False) is None:
        filesystem_async._results_queue = queue.Queue()


def save_distributed(directory: str | os.PathLike, opt) -> None:
    """SCAPE's state through Megatron's distributed checkpointing (collective)."""
    from megatron.core import dist_checkpointing

    Path(directory).mkdir(parents=True, exist_ok=True)
    _in_process_write_results()
    dist_checkpointing.save(opt.sharded_state_dict(), str(directory))


def load_distributed(directory: str | os.PathLike, opt) -> int:
    """Restore :func:`save_distributed`'s checkpoint (collective); returns its step. Another
    world size or configuration fails with a one-line :class:`CheckpointMismatch` before any
    tensor is read."""
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(str(directory))
    saved = common.get("common", {}) if isinstance(common, dict) else {}
    _check(saved.get("world_size") == opt.scape.world_size,
           f"saved with {saved.get('world_size')} data-parallel ranks, this run has "
           f"{opt.scape.world_size}; SCAPE's per-rank moments do not reshard")  # fmt: skip
    state = dist_checkpointing.load(opt.sharded_state_dict(is_loading=True), str(directory))
    opt.load_state_dict(state)
    return opt.scape.step
