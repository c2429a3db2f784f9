"""Where the megatron-core releases SCAPE runs on differ, in one place.

Tested: 0.16.1 (``requirements/cpu.txt``, ``make test``; the newest release for Python 3.11)
and 0.19.2 (``requirements/mcore-latest.txt``, ``make test-mcore-latest``; what
``environment.yml`` installs on clusters). The adapter uses only what both provide; what one
of them needs beyond that is here, each item naming the version that needs it:

* DDP options whose extra pre/post-collective work SCAPE's grad sync does not do
  (:data:`REFUSED_DDP_OPTIONS`, :func:`refuse_unsupported_ddp_options`): 0.19 adds
  ``fp4_param_gather`` and ``param_name_patterns_for_fp32_local_accumulation`` (main grads
  kept outside the grad buffer, which SCAPE packs alone).
* CUDA-graph weight grads (0.19): a param whose grad a graph replay accumulates carries
  ``_cudagraph_wgrad_ready_event``; its bucket may be read only after the current stream
  waits on it (:func:`wait_for_graph_replayed_grads`). 0.16 sets no such event.
* CPU only, 0.19: the stock bucket-group grad sync (dense baselines) asks for
  ``torch.cuda.current_stream()``; :mod:`scape.megatron.cpu_compat` answers megatron's calls
  with an inert stream (the stand-in serves 0.16 too, which never calls it on this path).

Differences that needed no code, for the record (both versions checked):

* ``get_megatron_optimizer`` constructs ``DistributedOptimizer`` by its module-level name and
  then sets further attributes on it (``grad_stats_parallel_group`` and ``tp_group`` in both,
  ``expert_tp_group`` in 0.19 too): :func:`scape.megatron.optimizer.build_scape_optimizer` lets the
  factory construct SCAPE's subclass with the factory's own arguments, so whatever a release
  sets afterwards lands on SCAPE's optimizer.
* 0.19's ``finish_grad_sync`` is idempotent within a step (``grad_reduce_finished``, reset
  by ``reset()``); SCAPE's handle is waited on once either way.
* 0.17 and newer need Python 3.12 (only cp312 wheels); ``make test-mcore-latest`` runs the
  0.19.2 wheel's Python code on this machine's 3.11.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = [
    "REFUSED_DDP_OPTIONS",
    "TESTED_VERSIONS",
    "megatron_core_version",
    "refuse_unsupported_ddp_options",
    "wait_for_graph_replayed_grads",
]

TESTED_VERSIONS = ("0.16.1", "0.19.2")

# DistributedDataParallelConfig field -> the first tested release that has it. SCAPE's grad
# sync packs the grad buffer and nothing else, and its param sync gathers nothing, so any
# option that adds work around Megatron's own collectives is refused. getattr with a default:
# a field the installed release lacks is off.
REFUSED_DDP_OPTIONS = {
    "reduce_scatter_with_fp32_accumulation": "0.16",
    "reuse_grad_buf_for_mxfp8_param_ag": "0.16",
    "fp8_param_gather": "0.16",
    "use_megatron_fsdp": "0.16",
    "fp4_param_gather": "0.19",
    "param_name_patterns_for_fp32_local_accumulation": "0.19",
}


def megatron_core_version() -> str:
    """The installed megatron-core's release, e.g. ``"0.19.2"``: its package metadata (0.19's
    ``megatron.core.__version__`` appends the commit of the git checkout it is run from)."""
    from importlib.metadata import version

    return version("megatron-core")


def refuse_unsupported_ddp_options(ddp_config) -> None:
    """Raise, naming the option and the fix, if ``ddp_config`` turns on one SCAPE cannot honour."""
    for option in REFUSED_DDP_OPTIONS:
        if getattr(ddp_config, option, None):
            raise ValueError(
                f"SCAPE does not support DistributedDataParallelConfig.{option}="
                f"{getattr(ddp_config, option)!r}: leave it at its default for SCAPE runs"
            )


def wait_for_graph_replayed_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """megatron-core 0.19: make the current stream wait for the CUDA-graph replays that
    accumulate these params' grads, as Megatron's own ``start_grad_sync`` does; each event
    once. Nothing to do where no param carries an event (0.16, eager runs, the CPU)."""
    events = {}
    for param in params:
        event = getattr(param, "_cudagraph_wgrad_ready_event", None)
        if event is not None:
            events[id(event)] = event
    if not events:
        return
    stream = torch.cuda.current_stream()
    for event in events.values():
        stream.wait_event(event)
