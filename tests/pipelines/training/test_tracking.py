"""RunLogger: what each run tells W&B (its group and tags), with wandb.init standing in."""

import sys
import types

from pipelines.training.config import compose
from pipelines.training.tracking import RunLogger, wandb_tags


def test_run_is_logged_in_its_experiments_group_with_filterable_tags(tmp_path, monkeypatch):
    cfg = compose(["experiment=llama500m_slimpj_quality", "scale=tiny", "optimizer=scape90",
                   "train.seed=7", "wandb.mode=offline", "wandb.tags=[extra]"])  # fmt: skip
    calls, logged = [], []

    class FakeRun:
        def log(self, row, step):
            logged.append((step, row))

        def finish(self):
            pass

    def init(**kwargs):
        calls.append(kwargs)
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    logger = RunLogger(tmp_path / "run", cfg, enabled=True)
    logger.start(resumed_from=0)
    logger.log({"step": 1, "tokens": 1024, "loss": 6.0, "bytes": {"masks": 10.0}})
    logger.finish()
    (kwargs,) = calls
    assert kwargs["group"] == "llama500m_slimpj_quality" and kwargs["mode"] == "offline"
    assert kwargs["tags"] == wandb_tags(cfg) == [
        "optimizer=SCAPE-90", "sparsity=0.9", "model=tiny_llama", "seed=7", "extra"
    ]  # fmt: skip
    assert logged == [(1, {"step": 1, "tokens": 1024, "loss": 6.0, "bytes/masks": 10.0})]
