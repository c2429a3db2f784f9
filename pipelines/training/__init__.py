"""The training runtime behind the pretrain stage: typed config, engines, trainer, checkpoints,
metrics, data, Slurm and run slots. It may import ``scape``, ``data_prep`` and ``eval``; it never
imports the stage modules (``pipelines.<stage>``) or ``pipelines.studies``."""
