"""The benchmarks' machinery (command line, rank launcher and workers, emulated cluster, quiet
protocol, sweep records, paper-scale formulas); the entry points (``python -m benchmarks.<name>``) sit above."""
