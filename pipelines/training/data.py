"""Batches for data-parallel training, read from prepared data with Megatron's GPTDataset.

Megatron's convention: at step s (0-based) with W ranks and B sequences per rank per step,
rank r gets global samples ``s*W*B + r*B .. s*W*B + (r+1)*B``. The order is fixed by the
seed (GPTDataset shuffles documents and samples with it), so a resumed run reads exactly
what an uninterrupted one would, and a sample never depends on the process that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from data_prep.config import SPLIT_NAMES
from data_prep.dataset import load_prepared

__all__ = ["Batch", "TrainingData", "load_training_data", "stack_samples"]

Batch = tuple[Tensor, Tensor]  # (tokens, labels), each [b, s] int64


def stack_samples(dataset, indices) -> Batch:
    samples = [dataset[i % len(dataset)] for i in indices]
    tokens = torch.stack([torch.as_tensor(s["tokens"], dtype=torch.int64) for s in samples])
    labels = torch.stack([torch.as_tensor(s["labels"], dtype=torch.int64) for s in samples])
    return tokens, labels


@dataclass
class TrainingData:
    train: object  # megatron GPTDataset over the train split
    validation: object  # megatron GPTDataset over the validation split
    world_size: int
    batch_per_rank: int  # sequences per rank per step (all its micro-batches)
    test: object | None = None  # megatron GPTDataset over the test split (None: empty)

    def rank_batch(self, step: int, rank: int) -> Batch:
        first = (step * self.world_size + rank) * self.batch_per_rank
        return stack_samples(self.train, range(first, first + self.batch_per_rank))

    def rank_micro_batches(self, step: int, rank: int, micro_batch_size: int) -> list[Batch]:
        tokens, labels = self.rank_batch(step, rank)
        return list(
            zip(tokens.split(micro_batch_size), labels.split(micro_batch_size), strict=True)
        )

    def validation_batches(
        self, rank: int, batches_per_rank: int, micro_batch_size: int
    ) -> list[Batch]:
        """A fixed, rank-disjoint slice of the validation split (wrapping if it is short)."""
        per_rank = batches_per_rank * micro_batch_size
        first = rank * per_rank
        tokens, labels = stack_samples(self.validation, range(first, first + per_rank))
        return list(
            zip(tokens.split(micro_batch_size), labels.split(micro_batch_size), strict=True)
        )


def load_training_data(
    data_dir: str | Path,
    *,
    seed: int,
    seq_length: int,
    world_size: int,
    batch_per_rank: int,
    steps: int,
    cache_dir: str | Path,
) -> TrainingData:
    """Open prepared data (sizes and headers checked) and build train/validation GPTDatasets.

    The train dataset holds ``steps * W * B`` samples; Megatron repeats the split in
    further epochs when it is shorter than that.
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    # Hashing tens of GB on every (re)start is too slow; the prepare stage verified them.
    prepared = load_prepared(data_dir, verify_hashes=False)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend_per_split=[([prepared.prefix(name)], None) for name in SPLIT_NAMES],
        tokenizer=prepared.build_tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # the model gets one causal mask per batch instead
        path_to_cache=str(Path(cache_dir)),
    )
    sizes = [steps * world_size * batch_per_rank, None, None]  # None: one epoch
    train, validation, test = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, config
    ).build()
    if train is None or validation is None or len(validation) == 0:
        raise ValueError(
            f"{data_dir}: the train or validation split is empty at seq_length {seq_length}"
        )
    return TrainingData(train, validation, world_size, batch_per_rank,
                        test if test is not None and len(test) else None)  # fmt: skip
