"""Multi-rank checkpoints: atomic publish, keep-last-K, corrupt ones skipped, world size checked."""

import json

import pytest
import torch

from pipelines.training.checkpoint import (
    CheckpointError,
    find_latest_valid,
    load_rank_files,
    save_checkpoint,
)
from scape.spawn import run_distributed


def _save_steps(rank, world_size, jobs):
    for root, steps, keep in jobs:
        for step in steps:
            common = {"model": torch.full((3,), float(step))} if rank == 0 else None
            state = {"shard": torch.full((2,), float(step * 10 + rank))}
            if root.name == "sharded":  # an optimizer writing its own files (as SCAPE's does)

                def state(directory, rank=rank, step=step):
                    (directory / "optimizer").mkdir(exist_ok=True)
                    (directory / "optimizer" / f"__{rank}.distcp").write_bytes(bytes([step] * 64))
                    return {"shard": torch.full((2,), float(step * 10 + rank))}

            save_checkpoint(root, step, common=common, rank_state=state, keep=keep)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """One 2-rank run saves every scenario's checkpoints (spawning ranks is the slow part)."""
    base = tmp_path_factory.mktemp("ckpt")
    jobs = {
        "keep2": ([1, 2, 3], 2),
        "corrupt": ([1, 2], 3),
        "manifest": ([1, 2], 3),
        "world": ([1], 3),
        "sharded": ([1, 2], 3),
    }
    run_distributed(
        _save_steps, 2, [(base / name, steps, keep) for name, (steps, keep) in jobs.items()]
    )
    return {name: base / name for name in jobs}


def test_save_keeps_last_k_and_round_trips(roots):
    tmp_path = roots["keep2"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step_00000002", "step_00000003"]
    latest = find_latest_valid(tmp_path, 2)
    common, mine = load_rank_files(latest, 1)
    assert torch.equal(common["model"], torch.full((3,), 3.0))
    assert torch.equal(mine["shard"], torch.full((2,), 31.0))


def test_corrupt_and_partial_checkpoints_are_never_used(roots):
    tmp_path = roots["corrupt"]
    newest = tmp_path / "step_00000002"
    with open(newest / "rank00001.pt", "r+b") as f:  # flip a byte: a corrupt shard
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    (tmp_path / ".step_00000003.partial").mkdir()  # a save killed half-way
    messages = []
    assert find_latest_valid(tmp_path, 2, log=messages.append).name == "step_00000001"
    assert "rank00001.pt does not match its sha256" in messages[0]


def test_missing_manifest_means_incomplete(roots):
    tmp_path = roots["manifest"]
    (tmp_path / "step_00000002" / "manifest.json").unlink()
    assert find_latest_valid(tmp_path, 2, log=lambda m: None).name == "step_00000001"


def test_a_different_world_size_is_refused_with_the_fix(roots):
    tmp_path = roots["world"]
    with pytest.raises(
        CheckpointError, match="world size 2, this run has 4; resume with the same number of ranks"
    ):
        find_latest_valid(tmp_path, 4)
    manifest = json.loads((tmp_path / "step_00000001" / "manifest.json").read_text())
    assert manifest["world_size"] == 2


def test_files_an_optimizer_writes_itself_are_hashed_too(roots):
    tmp_path = roots["sharded"]
    newest = tmp_path / "step_00000002"
    manifest = json.loads((newest / "manifest.json").read_text())
    assert {"optimizer/__0.distcp", "optimizer/__1.distcp"} <= set(manifest["files"])
    assert find_latest_valid(tmp_path, 2) == newest
    (newest / "optimizer" / "__1.distcp").write_bytes(b"\0" * 64)  # a torn sharded file
    messages = []
    assert find_latest_valid(tmp_path, 2, log=messages.append) == tmp_path / "step_00000001"
    assert "optimizer/__1.distcp does not match its sha256" in messages[0]
