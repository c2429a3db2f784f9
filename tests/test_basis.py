"""The chunked DCT: orthonormal, exact top-k per chunk, projection equals the transform, and
synthesis removes exactly the selected coefficients (what conservation rests on)."""

import pytest
import torch

from scape.basis import (
    ITERATED_MAX_K,
    MAX_CHUNK,
    ShardBasis,
    dct_matrix,
    selected_count,
    top_offsets,
)


def test_dct_matrix_is_orthonormal_and_the_same_every_call():
    for size in (1, 7, 100, 256):
        d = dct_matrix(size)
        assert torch.allclose(d @ d.T, torch.eye(size), atol=1e-5)
    assert torch.equal(dct_matrix(100), dct_matrix(100))


@pytest.mark.parametrize(
    "size,chunk,k", [(1000, 100, 1), (1037, 100, 2), (1037, 100, 3), (50, 100, 1), (300, 64, 64)]
)
def test_select_gather_synthesize(size, chunk, k):
    torch.manual_seed(0)
    basis = ShardBasis(size, chunk, k)
    assert basis.num_selected == (size // chunk) * k + min(k, size % chunk)
    assert selected_count(size, chunk, k) == basis.num_selected  # what byte tables count
    x = torch.randn(3, size)
    masks = torch.stack([basis.select(x[i]) for i in range(3)])
    assert masks.shape == (3, basis.num_selected)
    head, tail = basis.transform(x)
    for i in range(3):  # the k largest |coefficients| of every chunk, offsets ascending
        m = masks[i, : basis.full * k].view(basis.full, k)
        assert bool((m[:, 1:] > m[:, :-1]).all())
        chosen = head[i].abs().gather(-1, m) * (1 + 2.0**-15)  # top_offsets: 15 bits
        others = head[i].abs().scatter(-1, m, -1.0)
        assert bool((chosen.min(-1).values >= others.max(-1).values).all())
    values = basis.gather(x, masks)
    flat = torch.cat([head.reshape(3, -1), *([tail] if tail is not None else [])], -1)
    pos = []
    for i in range(3):
        head_pos = (
            masks[i, : basis.full * k].view(basis.full, k)
            + torch.arange(basis.full)[:, None] * chunk
        )
        pos.append(torch.cat([head_pos.reshape(-1), masks[i, basis.full * k :] + basis.split]))
    assert torch.allclose(values, flat.gather(-1, torch.stack(pos)), atol=1e-5)
    rest = x - basis.synthesize(values, masks)
    assert basis.gather(rest, masks).abs().max() < 1e-5  # sent coefficients are removed
    assert torch.allclose(
        rest.square().sum(-1), x.square().sum(-1) - values.square().sum(-1), rtol=1e-4, atol=1e-3
    )


@pytest.mark.parametrize("k", [1, 2, 10])
def test_projection_and_whole_transform_agree(k, monkeypatch):
    """gather picks by k between projecting on the selected rows and the whole chunked
    transform; both give the same coefficients (and so the same synthesis) up to rounding."""
    import scape.basis

    torch.manual_seed(1)
    basis = ShardBasis(1037, 100, k)
    x = torch.randn(2, 1037)
    masks = torch.stack([basis.select(x[i]) for i in range(2)])
    out = {}
    for limit in (0, 100):  # 0: always the whole transform; 100: always projection
        monkeypatch.setattr(scape.basis, "PROJECT_MAX_K", limit)
        values = basis.gather(x, masks)
        out[limit] = values, basis.synthesize(values, masks)
    assert torch.allclose(out[0][0], out[100][0], atol=1e-5)
    assert torch.allclose(out[0][1], out[100][1], atol=1e-5)


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=f"chunk=300 must be in \\[1, {MAX_CHUNK}\\]"):
        ShardBasis(1000, 300, 1)
    with pytest.raises(ValueError, match="k=5 must be in \\[1, chunk=4\\]"):
        ShardBasis(1000, 4, 5)


@pytest.mark.parametrize("k", [1, 3, 10, ITERATED_MAX_K, ITERATED_MAX_K + 1, 100])
def test_top_offsets_match_topk_and_rank_near_ties_by_offset(k):
    """The bit-packed keys pick what topk picks wherever magnitudes differ by more than
    2^-15, offsets ascending; an all-zero row (an embedding row never seen) and exact ties
    take the largest offsets."""
    torch.manual_seed(0)
    coefs = torch.randn(500, 100)
    got = top_offsets(coefs.clone(), k)
    magnitudes = coefs.abs().sort(-1, descending=True).values
    if k < 100:  # rows whose k-th and (k+1)-th magnitudes are 2^-15 apart or closer may differ
        apart = magnitudes[:, k - 1] - magnitudes[:, k] > magnitudes[:, k - 1] * 2.0**-15
    else:
        apart = torch.ones(500, dtype=torch.bool)
    assert apart.float().mean() > 0.9
    expected = coefs.abs().topk(k, dim=-1).indices.sort(-1).values
    assert torch.equal(got[apart], expected[apart])
    # every row, near ties included: one topk of the keys (the iterated maxima pick its set)
    keys = coefs.abs().view(torch.int32).bitwise_and(-256).bitwise_or(torch.arange(100).int())
    by_topk = keys.topk(k, dim=-1).values.bitwise_and(255).sort(-1).values.long()
    assert torch.equal(got, by_topk)
    ties = torch.zeros(2, 100)
    ties[1, :50] = -1.0  # 50 equal magnitudes: the largest offsets among them win
    got = top_offsets(ties, min(k, 50))
    assert got[0].tolist() == list(range(100 - min(k, 50), 100))
    assert got[1].tolist() == list(range(50 - min(k, 50), 50))
    assert top_offsets(torch.zeros(0, 100), k).shape == (0, k)


@pytest.mark.parametrize("k", [1, 2, 10])
def test_blocks_do_not_change_masks_or_coefficients(k, monkeypatch):
    """select and gather walk a shard in blocks of BLOCK_CHUNKS chunks: any block size,
    including one that does not divide the chunks, gives the same masks, and the projection
    (k <= PROJECT_MAX_K) the same coefficients bit for bit. Above it a block's GEMM may
    round differently with the block's row count (BLAS picks kernels by shape), which the
    simulator and the adapter share, as both walk a shard in the same blocks."""
    import scape.basis

    torch.manual_seed(5)
    basis = ShardBasis(2037, 100, k)
    x = torch.randn(2, 2037)
    results = []
    for block in (4096, 3, 1):
        monkeypatch.setattr(scape.basis, "BLOCK_CHUNKS", block)
        masks = torch.stack([basis.select(x[i]) for i in range(2)])
        results.append((masks, basis.gather(x, masks)))
    for masks, values in results[1:]:
        assert torch.equal(masks, results[0][0])
        if k <= scape.basis.PROJECT_MAX_K:
            assert torch.equal(values, results[0][1])
        assert torch.allclose(values, results[0][1], atol=1e-6)
