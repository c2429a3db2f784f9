"""Evaluation of SCAPE pre-training runs: exported checkpoints, perplexity, lm-eval tasks.

Nothing heavy is imported here (megatron-core and lm-eval take seconds to import), so
`import eval.export` in the training process costs only what it uses. See eval/README.md.
May import ``scape`` and ``data_prep``; never ``pipelines`` or ``benchmarks``.
"""
