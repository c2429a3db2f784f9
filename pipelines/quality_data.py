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
from torch import Tensor

from data_prep.config import SPLIT_NAMES
from data_prep.dataset import load_prepared

__all__ = ["Batch", "StudyData", "load_study_data"]

Batch = tuple[Tensor, Tensor]  # (tokens, labels), each [b, s] int64


@dataclass
class StudyData:
    train: object  # megatron GPTDataset over the train split
    validation: object  # megatron GPTDataset over the validation split
    vocab_size: int  # padded, as the model needs it
    world_size: int
    batch_per_worker: int

    def worker_batches(self, step: int) -> list[Batch]:
        """The W batches of step ``step`` (0-based), worker w's first."""
        W, B = self.world_size, self.batch_per_worker
        first = step * W * B
        return [_stack(self.train, range(first + w * B, first + (w + 1) * B)) for w in range(W)]

    def validation_batches(self, max_sequences: int | None, batch_size: int) -> list[Batch]:
        n = len(self.validation)
        if max_sequences is not None:
            n = min(n, max_sequences)
        return [
            _stack(self.validation, range(i, min(i + batch_size, n)))
            for i in range(0, n, batch_size)
        ]


def _stack(dataset, indices: range) -> Batch:
    samples = [dataset[i] for i in indices]
    tokens = torch.stack([torch.as_tensor(s["tokens"], dtype=torch.int64) for s in samples])
    labels = torch.stack([torch.as_tensor(s["labels"], dtype=torch.int64) for s in samples])
    return tokens, labels


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
    """Open prepared data (hash-checked) and build the train/validation GPTDatasets.

    The train dataset holds exactly ``steps * W * B`` samples (Megatron adds epochs when
    the split is shorter than that).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prepared = load_prepared(data_dir)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend_per_split=[([prepared.prefix(name)], None) for name in SPLIT_NAMES],
        tokenizer=prepared.build_tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # the model gets one causal mask per batch instead
        path_to_cache=str(Path(cache_dir) / Path(data_dir).name),
    )
    sizes = [steps * world_size * batch_per_worker, None, None]  # None: one epoch
    train, validation, _test = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, config
    ).build()
    vocab = int(prepared.metadata["tokenizer"].get("padded_vocab_size", prepared.vocab_size))
    if train is None or validation is None or len(validation) == 0:
        raise ValueError(f"{data_dir}: train or validation split is empty at seq {seq_length}")
    assert len(train) >= sizes[0], "GPTDataset returned fewer train samples than requested"
    if int(torch.as_tensor(train[0]["tokens"]).max()) >= vocab:
        raise ValueError(f"{data_dir}: token ids exceed the vocabulary of {vocab}")
    return StudyData(train, validation, vocab, world_size, batch_per_worker)
