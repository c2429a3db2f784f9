"""The benchmarks' machinery; the entry points (``python -m benchmarks.<name>``) sit above.

launch     one process per rank (in its namespace or on loopback), the one rank entry
step       the step timer's rank worker: the pretrain stage's engines, stepped and timed
bytecount  the byte count's rank worker: every method through Megatron's train step
netns      the emulated cluster: namespaces, bridge, veths and tbf shapers
quiet      the quiet-machine protocol (load, host probe, re-runs, noisy)
records    the step sweep's records and their one (de)serializer
paper      the paper's scale by formula: buckets, bytes, optimizer traffic
"""
