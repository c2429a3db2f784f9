"""Train and validation batches for the quality study, read with Megatron's GPTDataset.

Training samples follow Megatron's data-parallel convention: global sample
``step * W * B + w * B + b`` goes to worker ``w``, so workers see disjoint data at every
step and the whole order is fixed by the seed (GPTDataset shuffles documents and samples
with it). Validation is every sequence of the validation split (or a fixed prefix), in
order, the same for every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from data_prep.dataset import load_prepared
from pipelines.training.data import Batch, TrainingData, load_training_data, stack_samples

__all__ = ["Batch", "StudyData", "load_study_data"]


@dataclass
class StudyData:
    """The pretrain stage's ``TrainingData`` seen from the simulator: all W workers' batches."""

    data: TrainingData
    vocab_size: int  # padded, as the model needs it

    def validation_batches(self, max_sequences: int | None, batch_size: int,
                           split: str = "validation") -> list[Batch]:  # fmt: skip
        """The first ``max_sequences`` sequences (None: all) of ``split`` ("validation" or
        "test"), in order, as batches of ``batch_size`` [batch, seq_length]."""
        dataset = self.data.validation if split == "validation" else self.data.test
        if dataset is None:
            raise ValueError(f"{split}: this prepared dataset has no {split} split; prepare it "
                             "with a non-zero split_ratios entry for it")  # fmt: skip
        n = len(dataset)
        if max_sequences is not None:
            n = min(n, max_sequences)
        return [stack_samples(dataset, range(i, min(i + batch_size, n)))
                for i in range(0, n, batch_size)]  # fmt: skip


def load_study_data(
    data_dir: str | Path,
    *,
    seed: int,
    seq_length: int,
    world_size: int,
    batch_per_worker: int,
    steps: int,
    cache_dir: str | Path,
) -> StudyData:
    """Open prepared data (hash-checked: these files are small) and build its GPTDatasets."""
    prepared = load_prepared(data_dir)
    data = load_training_data(
        data_dir,
        seed=seed,
        seq_length=seq_length,
        world_size=world_size,
        batch_per_rank=batch_per_worker,
        steps=steps,
        cache_dir=Path(cache_dir) / Path(data_dir).name,
    )
    vocab = int(prepared.metadata["tokenizer"].get("padded_vocab_size", prepared.vocab_size))
    assert len(data.train) >= steps * world_size * batch_per_worker
    assert int(torch.as_tensor(data.train[0]["tokens"]).max()) < vocab
    return StudyData(data, vocab)
