"""Hydra stages: thin `main(cfg)` entry points over importable `run(cfg)` functions."""
