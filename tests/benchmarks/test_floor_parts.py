"""make bench-floor-parts: SCAPE's named spans, profiled inside the real floor step."""

import json

import pytest

from benchmarks import floor_parts

QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]
TINY = ["model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=2",
        "model.ffn_hidden_size=128", "train.bucket_size=200000"]  # fmt: skip


def test_every_scape_part_is_timed_inside_the_floor_step_and_dense_has_none(tmp_path):
    out = tmp_path / "parts.json"
    argv = ["--methods", "dense-no-overlap", "scape-99", "--steps", "2", "--warmup", "2",
            "--model-overrides", *TINY, "--out", str(out), *QUIET_OFF]  # fmt: skip
    assert floor_parts.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and "load_before" in doc["quiet"]
    scape, dense = doc["methods"]["scape-99"], doc["methods"]["dense-no-overlap"]
    # after the one dense warm-up step every part runs: pack in backward, the rest in the step
    assert all(scape["parts_s"][k] > 0 for k in floor_parts.PARTS)
    assert sum(scape["parts_s"].values()) < scape["step_s"]
    assert scape["forward_s"] > 0 and scape["backward_s"] > 0
    assert all(v == 0.0 for v in dense["parts_s"].values())  # dense AdamS has no SCAPE spans
    rows = floor_parts.table(doc)
    assert rows[0].startswith("| method | step ms (profiled) | forward | backward | scape.pack")
    assert len(rows) == 4 and rows[3].startswith("| scape-99 | ")


def test_a_launch_profiles_one_method():
    from benchmarks.step_rank import run

    with pytest.raises(ValueError, match="profile_parts times one method per launch"):
        run({"world_size": 1, "mode": "floor", "warmup": 0, "steps": 1, "profile_parts": True,
             "methods": [{"name": "a", "overrides": []}, {"name": "b", "overrides": []}],
             "cache_dir": "."}, 0)  # fmt: skip
