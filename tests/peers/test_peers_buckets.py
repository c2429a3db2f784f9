"""ParamBuffers: per-parameter state follows parameters when DDP re-buckets."""

import pytest
import torch
from peers_common import FakeBucket, weights_only_round_trip

from scape.peers.buckets import ParamBuffers


def _params():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in [(4, 3), (4,), (2, 4), (2,)]]


def _fill(pb, bucket):
    """Write each parameter's slice with values derived from the parameter itself."""
    flat = pb.get(bucket)
    offset = 0
    for p in bucket.parameters():
        flat["a"][offset : offset + p.numel()] = p.reshape(-1) * 2
        flat["b"][offset : offset + p.numel()] = p.reshape(-1) - 1
        offset += p.numel()


def _check(pb, bucket):
    flat = pb.get(bucket)
    offset = 0
    for p in bucket.parameters():
        assert torch.equal(flat["a"][offset : offset + p.numel()], p.reshape(-1) * 2)
        assert torch.equal(flat["b"][offset : offset + p.numel()], p.reshape(-1) - 1)
        offset += p.numel()


def _bucket(index, params):
    return FakeBucket(index, params, [torch.zeros_like(p) for p in params])


@pytest.mark.parametrize("keyed", [False, True])
def test_state_follows_parameters_across_rebucketing(keyed):
    ps = _params()
    pb = ParamBuffers(("a", "b"), ps if keyed else None)
    _fill(pb, _bucket(0, ps))  # DDP's first iteration: one bucket, registration order
    # The rebuild: reversed, and split over two buckets.
    rebuilt = [_bucket(0, [ps[3], ps[2]]), _bucket(1, [ps[1], ps[0]])]
    for b in rebuilt:
        _check(pb, b)
    # A one-bucket permutation with the same index and size is caught too.
    _check(pb, _bucket(0, ps[::-1]))
    # Bucket 1's old buffers were released into bucket 0: nothing stale is left behind.
    assert list(pb._live) == [0] and not pb._loose


def test_new_parameters_start_at_zero():
    ps = _params()
    pb = ParamBuffers(("a",), ps)
    flat = pb.get(_bucket(0, ps[:2]))
    assert flat["a"].shape == (16,) and not flat["a"].any()


def test_state_dict_is_layout_independent():
    ps = _params()
    pb = ParamBuffers(("a", "b"), ps)
    _fill(pb, _bucket(0, [ps[3], ps[2]]))
    _fill(pb, _bucket(1, [ps[1], ps[0]]))
    state = weights_only_round_trip(pb.state_dict())
    assert sorted(state["params"]) == [0, 1, 2, 3]
    fresh = ParamBuffers(("a", "b"), ps)
    fresh.load_state_dict(state)
    _check(fresh, _bucket(0, ps))  # a fresh DDP starts from registration order again


def test_saving_without_params_is_refused():
    ps = _params()
    pb = ParamBuffers(("a",))
    assert pb.state_dict() == {"params": {}}  # nothing to save yet is fine
    pb.get(_bucket(0, ps))
    with pytest.raises(ValueError, match="params"):
        pb.state_dict()


def test_foreign_parameter_and_bad_checkpoint_are_refused():
    ps = _params()
    pb = ParamBuffers(("a",), ps[:2])
    with pytest.raises(ValueError, match="not in `params`"):
        pb.get(_bucket(0, ps))
    with pytest.raises(ValueError, match="buffers"):
        pb.load_state_dict({"params": {0: {"z": torch.zeros(12)}}})
    pb.load_state_dict({"params": {0: {"a": torch.zeros(5)}}})
    with pytest.raises(ValueError, match="entries"):
        pb.get(_bucket(0, ps[:1]))
