"""The studies' internals: the quality study's config, data, runs and report, and the peers
study's report; the stages ``pipelines.quality_study`` and ``pipelines.peers_study`` drive them.
They may import ``pipelines.training``, ``scape``, ``data_prep`` and ``eval``, never a stage module."""
