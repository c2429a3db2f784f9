"""Performance benchmarks (issues 6, 8, 14): one entry point per make target, each
``python -m benchmarks.<name>`` writing one file under ``results/``; the machinery they
share is :mod:`benchmarks.harness`. ``results/bench/README.md`` (``make bench-report``) is
the summary.

  bytes          bench-bytes          bytes per rank per step, counted and at paper scale
  overhead       bench-overhead       SCAPE's optimizer-side work against a dense AdamS step
  megatron_step  bench-step           the pretrain stage's step on the emulated cluster;
                 bench-floor-parts    with --parts: its compute-only floor, part by part
  peers_cluster  bench-peers-cluster  the peers sweep's step times on the emulated cluster
  projection     bench-project        the cost model at the paper's 32-node cluster
  break_even     bench-break-even     the projection over bandwidth x tokens per GPU
  report         bench-report         results/bench/README.md from the JSON files
``benchmarks`` may import every package of ours; none of them imports ``benchmarks``.
"""
