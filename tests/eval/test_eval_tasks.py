"""The local offline tasks: deterministic, from the test split only, well formed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eval.build_tasks import TASK_NAMES, BuildConfig, build_examples, ensure_tasks, sentences
from eval.splits import SplitReader

CFG = BuildConfig(seed=5, examples=40)


@pytest.fixture(scope="module")
def examples(prepared):
    return build_examples(prepared, CFG)


@pytest.fixture(scope="module")
def test_docs(prepared) -> dict[int, str]:
    reader, tok = SplitReader.open(prepared, "test"), prepared.build_tokenizer()
    return {i: " ".join(tok.detokenize(reader.document(i)).split()) for i in range(len(reader))}


def test_same_seed_same_tasks_other_seed_other_tasks(prepared, examples):
    assert build_examples(prepared, CFG) == examples
    assert build_examples(prepared, replace(CFG, seed=6)) != examples
    assert all(0 < len(examples[name]) <= CFG.examples for name in TASK_NAMES)
    assert len(examples["scape_lastword"]) == len(examples["scape_nextsent"]) == CFG.examples


def test_examples_are_test_split_text(examples, test_docs):
    assert len(test_docs) >= 2  # distractors come from other documents
    for ex in examples["scape_lastword"]:
        assert ex["target"].isalpha() and len(ex["target"]) >= 3
        assert f"{ex['context']} {ex['target']}" in test_docs[ex["doc"]]
        assert CFG.min_context_words <= len(ex["context"].split()) <= CFG.max_context_words
    for ex in examples["scape_nextsent"]:
        endings, label = ex["endings"], ex["label"]
        assert len(endings) == 4 and len(set(endings)) == 4 and 0 <= label < 4
        assert f"{ex['ctx']} {endings[label]}" in test_docs[ex["doc"]]
        distractors = [e for k, e in enumerate(endings) if k != label]
        assert all(e not in test_docs[ex["doc"]] for e in distractors)
        assert all(any(e in doc for doc in test_docs.values()) for e in distractors)
    for ex in examples["scape_testppl"]:
        assert ex["text"] in test_docs[ex["doc"]]
    # answer positions are drawn, not fixed
    assert len({ex["label"] for ex in examples["scape_nextsent"]}) == 4


def test_examples_spread_over_documents(examples, test_docs):
    for name in TASK_NAMES:
        assert len({ex["doc"] for ex in examples[name]}) == len(test_docs), name


def test_sentence_splitting_keeps_abbreviations_and_initials():
    text = 'Dr. Smith met J. R. Tolkien in the U.S. in 1950. "It rained." Then it stopped!'
    assert sentences(text) == [
        "Dr. Smith met J. R. Tolkien in the U.S. in 1950.",
        '"It rained."',
        "Then it stopped!",
    ]


def test_files_are_rebuilt_only_when_inputs_change(prepared, tmp_path):
    first = ensure_tasks(prepared, CFG, tmp_path)
    files = {name: tmp_path / f"{name}.jsonl" for name in TASK_NAMES}
    stamps = {name: f.stat().st_mtime_ns for name, f in files.items()}
    assert ensure_tasks(prepared, CFG, tmp_path) == first
    assert {name: f.stat().st_mtime_ns for name, f in files.items()} == stamps
    other = ensure_tasks(prepared, replace(CFG, seed=6), tmp_path)
    assert other["config"]["seed"] == 6 and other["tasks"] != first["tasks"]


def test_chance_rate_is_what_a_guesser_that_never_reads_scores() -> None:
    from eval.build_tasks import chance_rate

    words = [{"target": w} for w in ["the"] * 3 + ["river", "city", "war", "king", "sea"]]
    assert chance_rate("scape_lastword", words) == 3 / 8  # always answer "the"
    choices = [{"endings": ["a", "b", "c", "d"]}, {"endings": ["a", "b"]}]
    assert chance_rate("scape_nextsent", choices) == (0.25 + 0.5) / 2
    assert chance_rate("scape_testppl", [{"text": "x"}]) is None
    assert chance_rate("scape_lastword", []) is None
