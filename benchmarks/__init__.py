"""Performance benchmarks (issue 6): bytes on the wire, step time on an emulated
bandwidth-limited cluster, optimizer overhead, and an alpha-beta cost model projected to
the paper's cluster. ``make bench`` runs them all; ``results/bench/README.md`` is the summary.

Entry points (each ``python -m benchmarks.<name>``, each writes one JSON file):
  bytes       bytes per rank per step by kind, every method and mask encoding (delta too)
  overhead    SCAPE's optimizer-side work vs a dense AdamS step, one Llama-1.8B bucket
  megatron_step  the pretrain stage's Megatron train step in network namespaces joined by
              tbf-shaped veths, per rank count a compute-only floor (root only); also the
              step times of ``make reproduce-table``'s efficiency table (--suite reproduce)
  cluster     the communicator-level workload in the same namespaces (root only)
  projection  the cost model at 32 GH200 nodes, assumptions recorded
  break_even  the projection over bandwidth x tokens per GPU, the x3.26 contour, measured
              rounds placed by their comm/compute ratio
  report      results/bench/README.md from the JSON files
  core        (the lead's) bytes by encoding and selection overhead for one model size
Pieces:
  quiet       the quiet-machine protocol every entry point follows (load, re-runs, noisy)
  step_rank   a rank of megatron_step: the stage's engines stepped interleaved, or the floor
  netns       the namespaces, bridge, veths and shapers; always torn down
  launch      one rank process per namespace (or on loopback), results as JSON
  rank_main   a rank: collective calibration sweep, then methods alternating step by step
  workloads   the benchmarked step behind one seam: dense ZeRO-1 / SCAPE over scape.comm
  megatron_workload  the same seam over Megatron's train step (dense, and SCAPE's adapter)
  compute     the small Llama and byte-level text behind the communicator-level workload
  ring        a p2p ring reduce-scatter (gloo's own sends ~2x the ring's bytes)
  costmodel   alpha-beta ring collectives: fit and step-time prediction
``benchmarks`` may import every package of ours; none of them imports ``benchmarks``.
"""
