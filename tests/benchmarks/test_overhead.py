"""bench-overhead's parts are the library's step functions (a toy bucket, for function only:
nothing here is a timing), and its traffic model counts every entry on every rank."""

import math

import torch

from benchmarks.harness.paper import traffic_bytes
from benchmarks.overhead import measure


def test_every_part_runs_on_a_toy_bucket():
    m = measure(2, 350, 0.9, 1, torch.device("cpu"))
    assert m["selected_per_shard"] == 3 * 10 + 10  # 3 chunks of 100 and a tail of 50, k=10
    parts = {"select", "accumulate", "pack", "commit", "step"}
    assert {k.split(".", 1)[1] for k in m["median_s"] if k.startswith("scape.")} == parts
    assert {k for k in m["median_s"] if k.startswith("dense.")} == {"dense.scale", "dense.update"}
    assert all(math.isfinite(v) and v >= 0 for v in m["median_s"].values())


def test_traffic_grows_with_all_entries_for_scape_and_the_shard_for_dense():
    small, large = traffic_bytes(4, 1000, 10), traffic_bytes(8, 1000, 10)
    assert sum(large["scape"].values()) > 1.9 * sum(small["scape"].values())
    assert large["dense"]["update"] == small["dense"]["update"]  # one shard either way
