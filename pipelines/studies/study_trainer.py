"""A study's runs trained one after another in one process, their data loaded once.

``make quality-study`` (:mod:`pipelines.quality_study`) and ``make quality-product-path``
(:mod:`pipelines.studies.product_path`) both train lists of :class:`RunSpec` through
:func:`~pipelines.studies.quality_run.train_run`. :class:`StudyTrainer` holds what the runs
share: each seed's data (built once per dataset, seed and shape) and the validation batches
(once per dataset, sequence length and subset size: validation order is not shuffled, so
every seed reads the same ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.studies.quality_config import RunSpec

__all__ = ["StudyTrainer"]


class StudyTrainer:
    """``trainer(spec, into)`` trains (or resumes, or finds finished) one run into ``into``
    and returns its final record. ``code``: the
    :func:`~pipelines.studies.protocol.code_version` the runs record; ``cache_dir``: Megatron's
    dataset index cache; ``checkpoint_s``: wall seconds between a run's checkpoints."""

    def __init__(self, code: dict[str, Any], *, cache_dir: str | Path, checkpoint_s: float,
                 final_test: bool = False) -> None:  # fmt: skip
        self.code, self.cache_dir, self.checkpoint_s = code, cache_dir, checkpoint_s
        self.final_test = final_test  # each run's final record carries the test split's loss
        self._data: dict[tuple, Any] = {}
        self._validation: dict[tuple, tuple[list, list]] = {}
        self._test: dict[tuple, list] = {}

    def data(self, spec: RunSpec) -> Any:
        """The run's :class:`~pipelines.studies.quality_data.StudyData`."""
        from pipelines.studies.quality_data import load_study_data

        s = spec.scale
        key = (spec.data_dir, spec.seed, s.seq_length, s.world_size, s.batch_per_worker, s.steps)
        if key not in self._data:
            self._data[key] = load_study_data(
                spec.data_dir, seed=spec.seed, seq_length=s.seq_length, world_size=s.world_size,
                batch_per_worker=s.batch_per_worker, steps=s.steps, cache_dir=self.cache_dir,
            )  # fmt: skip
        return self._data[key]

    def validation(self, spec: RunSpec) -> tuple[list, list]:
        """The curve's batches (the first ``val_max_sequences``) and the final loss's (the
        whole validation split)."""
        s = spec.scale
        key = (spec.data_dir, s.seq_length, s.val_max_sequences)
        if key not in self._validation:
            data = self.data(spec)
            self._validation[key] = (data.validation_batches(s.val_max_sequences, batch_size=64),
                                     data.validation_batches(None, batch_size=64))  # fmt: skip
        return self._validation[key]

    def test(self, spec: RunSpec) -> list | None:
        """The whole test split's batches when ``final_test``, else None."""
        if not self.final_test:
            return None
        key = (spec.data_dir, spec.scale.seq_length)
        if key not in self._test:
            self._test[key] = self.data(spec).validation_batches(None, 64, split="test")
        return self._test[key]

    def __call__(self, spec: RunSpec, into: Path) -> dict[str, Any]:
        from pipelines.studies.quality_run import train_run

        return train_run(spec, self.data(spec), *self.validation(spec), into, self.code,
                         checkpoint_s=self.checkpoint_s,
                         final_test_batches=self.test(spec))  # fmt: skip
