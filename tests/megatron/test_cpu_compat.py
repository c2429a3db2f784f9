"""The CPU compatibility layer is inert on the CUDA path.

Its CPU behaviour (idempotent, scoped to megatron's code) is checked inside the spawned ranks of
``test_dense.py``, so as not to pay for another process start-up.
"""

import sys

import torch

from scape.megatron import cpu_compat


def test_inactive_on_the_cuda_path(monkeypatch):
    """With CUDA available, install imports nothing, patches nothing, pushes no mode."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpu_compat, "_MODE", None)
    # every stand-in's target; megatron's module only if an earlier test imported it (then
    # it must stay untouched too)
    watched = [
        (sys.modules[module], attr)
        for module, attr, _ in cpu_compat.STAND_INS
        if module in sys.modules
    ]
    assert {attr for _, attr in watched} >= {"current_device", "current_stream", "get_rng_state"}
    before = [getattr(obj, name) for obj, name in watched]
    modules_before = set(sys.modules)
    modes_before = torch._C._len_torch_function_stack()

    assert cpu_compat.install_cpu_compat() is False
    assert cpu_compat.install_cpu_compat() is False

    assert [getattr(obj, name) for obj, name in watched] == before
    assert set(sys.modules) == modules_before
    assert torch._C._len_torch_function_stack() == modes_before
    assert not cpu_compat.is_cpu_compat_installed()


def test_outside_megatron_is_a_no_op_without_the_mode(monkeypatch):
    """Where the mode is not installed (CUDA), the bypass leaves torch functions as they are."""
    monkeypatch.setattr(cpu_compat, "_MODE", None)
    with cpu_compat.outside_megatron():
        assert torch._C._is_torch_function_enabled()
    assert torch._C._is_torch_function_enabled()
