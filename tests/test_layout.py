import pytest

from scape.layout import FlatLayout


def test_contiguous_single_bucket_is_padded_to_world_size():
    lay = FlatLayout.contiguous([5, 3, 4], world_size=4)
    assert lay.param_offsets == (0, 5, 8)
    assert lay.buckets == ((0, 12),) and lay.total == 12
    lay = FlatLayout.contiguous([5, 3, 3], world_size=4)
    assert lay.buckets == ((0, 12),) and lay.shard_size(0) == 3


def test_contiguous_multiple_buckets_close_at_param_boundaries():
    lay = FlatLayout.contiguous([6, 6, 6, 1], world_size=4, bucket_size=10)
    assert lay.buckets == ((0, 12), (12, 20))
    assert lay.param_offsets == (0, 6, 12, 18)


def test_invalid_layouts_are_rejected():
    with pytest.raises(ValueError, match="not divisible"):
        FlatLayout((0,), (3,), ((0, 3),), 3, world_size=2)
    with pytest.raises(ValueError, match="outside"):
        FlatLayout((0,), (9,), ((0, 4),), 4, world_size=2)
