"""Performance benchmarks: bytes on the wire, step time on an emulated cluster, optimizer
overhead, and an alpha-beta cost model projected to the paper's cluster.

``make bench`` runs them all and writes ``results/bench/*.json`` and its README. Modules:
  netns       network namespaces joined by tbf-shaped veth links (the emulated cluster)
  launch      one rank process per namespace, results collected as JSON
  rank_main   a rank's program: collective calibration sweep, alternating training steps
  compute     the small Llama and byte-level text behind every step
  workloads   the benchmarked step (dense ZeRO-1 / SCAPE over scape.comm) behind one seam
``scape`` imports nothing from here.
"""
