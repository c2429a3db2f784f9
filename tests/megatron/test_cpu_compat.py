"""The CPU compatibility layer is inert on the CUDA path.

Its CPU behaviour (idempotent, scoped to megatron's code) is checked inside the spawned ranks of
``test_dense.py``, so as not to pay for another process start-up.
"""

import torch

from scape.megatron import cpu_compat


def test_inactive_on_the_cuda_path(monkeypatch):
    """With CUDA available, install patches nothing and pushes no torch-function mode."""
    from megatron.core.tensor_parallel import random as mcore_random

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpu_compat, "_MODE", None)
    watched = {
        "torch.cuda.current_device": (torch.cuda, "current_device"),
        "torch.cuda.get_rng_state": (torch.cuda, "get_rng_state"),
        "mcore._get_cuda_rng_state": (mcore_random, "_get_cuda_rng_state"),
        "mcore._set_cuda_rng_state": (mcore_random, "_set_cuda_rng_state"),
    }
    before = {k: getattr(obj, attr) for k, (obj, attr) in watched.items()}
    modes_before = torch._C._len_torch_function_stack()

    assert cpu_compat.install_cpu_compat() is False
    assert cpu_compat.install_cpu_compat() is False

    after = {k: getattr(obj, attr) for k, (obj, attr) in watched.items()}
    assert after == before
    assert torch._C._len_torch_function_stack() == modes_before
    assert not cpu_compat.is_cpu_compat_installed()
