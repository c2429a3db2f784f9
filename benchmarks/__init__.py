"""Performance benchmarks (issues 6, 8, 14): one entry point per make target, each
``python -m benchmarks.<name>`` (its docstring's first line names the target) writing under
``results/``; their machinery is :mod:`benchmarks.harness`, the summary ``results/bench/README.md``
(``make bench-report``). ``benchmarks`` may import every package of ours; none imports it.
"""
