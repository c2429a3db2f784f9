"""Performance benchmarks (issues 6, 14): bytes on the wire, step time on an emulated
bandwidth-limited cluster, optimizer overhead, and an alpha-beta cost model projected to
the paper's cluster. ``make bench`` runs them all; ``results/bench/README.md`` is the summary.

Entry points (each ``python -m benchmarks.<name>``, each writes one JSON file):
  bytes       bytes per rank per step by kind through Megatron's train step (counted, and
              checked against the shared formula), and at paper scale (formula)
  overhead    SCAPE's optimizer-side work vs a dense AdamS step, one Llama-1.8B bucket
  megatron_step  the pretrain stage's Megatron train step in network namespaces joined by
              tbf-shaped veths, per rank count a compute-only floor (root only); also the
              step times of ``make reproduce-table``'s efficiency table (--suite reproduce)
  peers_cluster  whole pretrain-stage runs of the peers experiment on the emulated cluster
  projection  the cost model at 32 GH200 nodes, assumptions recorded
  break_even  the projection over bandwidth x tokens per GPU, the x3.26 contour, measured
              rounds placed by their comm/compute ratio
  report      results/bench/README.md from the JSON files
Pieces:
  quiet       the quiet-machine protocol every entry point follows (load, re-runs, noisy)
  step_rank   a rank of megatron_step: the stage's engines of a launch stepped, or the floor
  pretrain_rank  a rank of peers_cluster: the pretrain stage's trainer, unchanged
  netns       the namespaces, bridge, veths and shapers; always torn down
  launch      one rank process per namespace (or on loopback), results as JSON
  rank_main   a rank of the byte count: every method through Megatron's train step
  megatron_workload  one such method (dense, or SCAPE's adapter) and a tap counting
              Megatron's own collectives
  compute     the small Llama's shape and the byte-level text behind the byte count
  scale       Megatron's buckets and both methods' bytes at paper scale (formulas)
  costmodel   alpha-beta ring collectives: fit and step-time prediction
``benchmarks`` may import every package of ours; none of them imports ``benchmarks``.
"""
