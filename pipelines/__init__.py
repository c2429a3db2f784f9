"""Hydra stages a user runs (`python -m pipelines.<stage>`): thin `main(cfg)` entry points over
importable `run(cfg)` functions. A stage may import other stages, `pipelines.studies`,
`pipelines.training`, `eval`, `data_prep` and `scape`; none of those imports a stage.
"""
