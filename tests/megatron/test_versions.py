"""scape.megatron.versions: the refused DDP options and the CUDA-graph event wait (no megatron
import here; the installed release is checked in test_dense.py's spawned ranks)."""

from types import SimpleNamespace

import pytest
import torch

from scape.megatron import versions


def _ddp_config(**options) -> SimpleNamespace:
    return SimpleNamespace(**{**_defaults(), **options})


def _defaults() -> dict:
    return {"reduce_scatter_with_fp32_accumulation": False, "fp8_param_gather": False,
            "param_name_patterns_for_fp32_local_accumulation": ()}  # fmt: skip


def test_defaults_and_options_a_release_lacks_pass():
    versions.refuse_unsupported_ddp_options(_ddp_config())  # 0.16-like: no fp4 field at all


@pytest.mark.parametrize(
    "option, value",
    [
        ("fp4_param_gather", True),
        ("param_name_patterns_for_fp32_local_accumulation", ("*.weight",)),
        ("reduce_scatter_with_fp32_accumulation", True),
    ],
)
def test_each_refused_option_names_itself_and_the_fix(option, value):
    with pytest.raises(ValueError) as err:
        versions.refuse_unsupported_ddp_options(_ddp_config(**{option: value}))
    message = str(err.value)
    assert f"DistributedDataParallelConfig.{option}={value!r}" in message
    assert "leave it at its default" in message and "\n" not in message


def test_graph_event_wait_is_a_no_op_without_events():
    """0.16, eager runs, the CPU: no param carries an event, so no CUDA call is made."""
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    versions.wait_for_graph_replayed_grads(params)  # would raise on a CPU build if it called


def test_graph_event_wait_waits_once_per_event(monkeypatch):
    waited = []
    stream = SimpleNamespace(wait_event=waited.append)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    shared, own = object(), object()
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    params[0]._cudagraph_wgrad_ready_event = shared
    params[1]._cudagraph_wgrad_ready_event = shared
    params[2]._cudagraph_wgrad_ready_event = own
    versions.wait_for_graph_replayed_grads(params)
    assert waited == [shared, own]
