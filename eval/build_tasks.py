"""Offline downstream tasks built from the held-out TEST split of a prepared corpus.

The standard zero-shot set (LAMBADA, HellaSwag, PIQA, ARC, WinoGrande) needs the Hugging
Face hub. These three tasks need nothing but the prepared data, and no model has seen their
text: the test split is held out from training and from the tokenizer's training.

Construction (deterministic for a given prepared dataset, seed and BuildConfig):

1. Documents. The test split's documents are decoded with the data's own tokenizer, in an
   order fixed by the seed (a permutation of the document indices), reading only as many
   as are needed. Each line of a document is a paragraph; paragraphs are cut into
   sentences after `.`, `!` or `?` (optionally followed by a closing quote or bracket)
   when the next sentence starts with a capital or digit, except after a single capital
   or a common abbreviation (`Dr.`, `e.g.`, `U.S.`, ...). The splitter is a heuristic:
   a rare passage may be cut mid-sentence, which only makes a task slightly noisier.
2. Candidates, from within one paragraph:
   * `scape_lastword` (LAMBADA-like cloze): a run of consecutive sentences ending at
     sentence j, the shortest with at least `min_context_words + 1` words, at most
     `max_context_words + 1`, whose last sentence ends in a purely alphabetic word of at
     least 3 letters right before its `.`/`!`/`?`. The target is that word, the context
     everything before it (the final punctuation is dropped). Metrics: acc (the target is
     the model's greedy continuation, token for token, as lm-eval scores LAMBADA) and the
     perplexity of the target. Unlike LAMBADA no human filtering ensures that the word
     needs the broad context: this measures last-word prediction, not discourse tracking.
   * `scape_nextsent` (HellaSwag-like multiple choice): a context of consecutive sentences
     (same length rule) and the sentence that follows it (`min_ending_words` to
     `max_ending_words` words) as the true ending, against `distractors` (3) sentences drawn
     from OTHER test documents, preferring lengths within half to twice the true one. The
     answer's position is drawn uniformly. Metrics: acc and acc_norm (by byte length).
   * `scape_testppl` (WikiText-like): whole paragraphs of at least `min_context_words`
     words, scored with rolling loglikelihood: word_perplexity, byte_perplexity,
     bits_per_byte.
3. Selection. Candidates are shuffled within each document and taken round-robin across
   the documents read (so examples spread over documents: at corpus scale each comes from a
   different document), up to `examples` per task, and the selected list is shuffled so
   that lm-eval's `limit` takes a spread-out sample.

Each task gets its own random stream derived from (seed, task), so changing one task's
construction does not reshuffle the others. The output is `<out>/<task>.jsonl` plus
`manifest.json` (prepared data fingerprint, tokenizer sha256, config, counts, file sha256).

    python -m eval.build_tasks --prepared data/enwiki_sample__bytebpe4k --out /tmp/tasks
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.dataset import PreparedData, load_prepared
from data_prep.errors import DataPrepError
from eval.errors import EvalError
from eval.splits import SplitReader

__all__ = [
    "TASK_NAMES",
    "BuildConfig",
    "build_examples",
    "chance_rate",
    "ensure_tasks",
    "write_tasks",
]

BUILDER_VERSION = 1
TASK_NAMES = ("scape_lastword", "scape_nextsent", "scape_testppl")
MANIFEST = "manifest.json"

Example = dict[str, Any]


@dataclass(frozen=True)
class BuildConfig:
    seed: int = 1234
    examples: int = 500  # per task; fewer when the split holds fewer candidates
    split: str = "test"
    min_context_words: int = 20
    max_context_words: int = 80
    min_ending_words: int = 4
    max_ending_words: int = 40
    distractors: int = 3


# sentence boundary: end punctuation (maybe closed by a quote/bracket), space, capital/digit
_BOUNDARY = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATION = re.compile(
    r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|Mt|No|vs|etc|Gen|Col|Lt|Inc|Ltd|Co|e\.g|i\.e))\.$"
)
_LAST_WORD = re.compile(r"^(?P<context>.*\S)\s+(?P<word>[A-Za-z]{3,})[.!?]$", re.DOTALL)
_PROSE = re.compile(r"^[\"'(]?[A-Za-z0-9]")  # not a list item, table row or markup line
_FULL_SENTENCE = re.compile(r"^[\"'(]?[A-Z0-9].*[.!?][\"')\]]?$", re.DOTALL)


def sentences(paragraph: str) -> list[str]:
    merged: list[str] = []
    for piece in _BOUNDARY.split(" ".join(paragraph.split())):
        if merged and _ABBREVIATION.search(merged[-1]):
            merged[-1] += " " + piece
        else:
            merged.append(piece)
    return [s for s in merged if s]


def _words(text: str) -> int:
    return len(text.split())


def _is_ending(sentence: str, cfg: BuildConfig) -> bool:
    """A complete sentence of a usable length (true endings and distractors alike)."""
    words = _words(sentence)
    return cfg.min_ending_words <= words <= cfg.max_ending_words and bool(
        _FULL_SENTENCE.match(sentence)
    )


def _context_start(sents: list[str], end: int, cfg: BuildConfig, extra: int) -> int | None:
    """First sentence of the shortest run ending at `end` with enough words, or None."""
    words = 0
    for start in range(end, -1, -1):
        words += _words(sents[start])
        if words >= cfg.min_context_words + extra:
            return start if words <= cfg.max_context_words + extra else None
    return None


@dataclass
class _Document:
    index: int
    paragraphs: list[list[str]]  # sentences of each paragraph


def _candidates(doc: _Document, cfg: BuildConfig) -> dict[str, list[Example]]:
    found: dict[str, list[Example]] = {name: [] for name in TASK_NAMES}
    for p, sents in enumerate(doc.paragraphs):
        where = f"{cfg.split}:{doc.index}:{p}"
        paragraph = " ".join(sents)
        if _words(paragraph) >= cfg.min_context_words:
            found["scape_testppl"].append({"id": where, "doc": doc.index, "text": paragraph})
        for j in range(len(sents)):
            start = _context_start(sents, j, cfg, extra=1)
            match = _LAST_WORD.match(" ".join(sents[start : j + 1])) if start is not None else None
            if match:
                found["scape_lastword"].append(
                    {
                        "id": f"{where}:{j}",
                        "doc": doc.index,
                        "context": match["context"],
                        "target": match["word"],
                    }
                )
            if j == 0 or not _is_ending(sents[j], cfg):
                continue
            start = _context_start(sents, j - 1, cfg, extra=0)
            if start is not None:
                found["scape_nextsent"].append(
                    {
                        "id": f"{where}:{j}",
                        "doc": doc.index,
                        "ctx": " ".join(sents[start:j]),
                        "ending": sents[j],
                    }
                )
    return found


def _documents(prepared: PreparedData, cfg: BuildConfig) -> Iterator[_Document]:
    reader = SplitReader.open(prepared, cfg.split)
    tokenizer = prepared.build_tokenizer()
    for index in np.random.default_rng([cfg.seed, 0]).permutation(len(reader)).tolist():
        text = tokenizer.detokenize(reader.document(index))
        prose = (line for line in text.split("\n") if _PROSE.match(line.strip()))
        yield _Document(index, [sentences(line) for line in prose])


def build_examples(prepared: PreparedData, cfg: BuildConfig) -> dict[str, list[Example]]:
    """The examples of every task, in their final (shuffled) order."""
    total_docs = prepared.metadata["splits"][cfg.split]["documents"]
    per_doc: dict[str, list[list[Example]]] = {name: [] for name in TASK_NAMES}
    sentence_pool: list[tuple[int, str]] = []  # (document, sentence) for distractors
    for count, doc in enumerate(_documents(prepared, cfg), start=1):
        for name, found in _candidates(doc, cfg).items():
            per_doc[name].append(found)
        sentence_pool.extend(
            (doc.index, s) for sents in doc.paragraphs for s in sents if _is_ending(s, cfg)
        )
        enough = all(sum(map(len, lists)) >= cfg.examples for lists in per_doc.values())
        if enough and count >= min(total_docs, cfg.examples):
            break
    tasks = {}
    for k, name in enumerate(TASK_NAMES, start=1):
        rng = np.random.default_rng([cfg.seed, k])
        chosen = _round_robin(per_doc[name], cfg.examples, rng)
        if name == "scape_nextsent":
            chosen = [_with_distractors(ex, sentence_pool, cfg, rng) for ex in chosen]
        tasks[name] = [chosen[i] for i in rng.permutation(len(chosen)).tolist()]
    if not all(tasks.values()):
        empty = ", ".join(name for name, rows in tasks.items() if not rows)
        raise EvalError(
            f"the {cfg.split} split of {prepared.path} yields no examples for {empty} "
            f"({total_docs} documents); prepare more data or lower min_context_words"
        )
    return tasks


def _round_robin(per_doc: list[list[Example]], limit: int, rng: np.random.Generator) -> list:
    queues = [[found[i] for i in rng.permutation(len(found)).tolist()] for found in per_doc]
    chosen: list[Example] = []
    for depth in range(max(map(len, queues), default=0)):
        for queue in queues:
            if depth < len(queue) and len(chosen) < limit:
                chosen.append(queue[depth])
    return chosen


def _with_distractors(
    example: Example, pool: list[tuple[int, str]], cfg: BuildConfig, rng: np.random.Generator
) -> Example:
    others = [s for doc, s in pool if doc != example["doc"] and s != example["ending"]]
    n = _words(example["ending"])
    similar = [s for s in others if n / 2 <= _words(s) <= 2 * n]
    candidates = similar if len(similar) >= cfg.distractors else others
    if len(candidates) < cfg.distractors:
        raise EvalError(
            f"scape_nextsent needs distractor sentences from other {cfg.split} documents but the "
            f"split has too few; prepare more data (more documents in the {cfg.split} split)"
        )
    picked = [candidates[i] for i in rng.choice(len(candidates), cfg.distractors, replace=False)]
    label = int(rng.integers(cfg.distractors + 1))
    endings = picked[:label] + [example["ending"]] + picked[label:]
    return {k: example[k] for k in ("id", "doc", "ctx")} | {"endings": endings, "label": label}


def _key(prepared: PreparedData, cfg: BuildConfig) -> dict[str, Any]:
    return {
        "builder_version": BUILDER_VERSION,
        "prepared_fingerprint": prepared.metadata["fingerprint"],
        "tokenizer_sha256": prepared.metadata["tokenizer"]["sha256"],
        "config": asdict(cfg),
    }


def chance_rate(task: str, rows: list[Example]) -> float | None:
    """What a guesser that never reads the context scores on ``rows``: for the cloze, always
    answering the task's most frequent last word (not 0: a frequent word is right by luck);
    for next-sentence choice, 1 / the number of endings. None for a perplexity task."""
    if not rows:
        return None
    if task == "scape_lastword":
        return Counter(r["target"] for r in rows).most_common(1)[0][1] / len(rows)
    if task == "scape_nextsent":
        return statistics.fmean(1.0 / len(r["endings"]) for r in rows)
    return None


def write_tasks(prepared: PreparedData, cfg: BuildConfig, out_dir: str | Path) -> dict[str, Any]:
    """Build the tasks and write them under `out_dir`; return the manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = build_examples(prepared, cfg)
    files = {}
    for name, rows in tasks.items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        _atomic_text(out / f"{name}.jsonl", text)
        files[name] = {
            "examples": len(rows),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "chance": chance_rate(name, rows),
        }
    manifest = _key(prepared, cfg) | {"prepared": str(prepared.path), "tasks": files}
    _atomic_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")  # last: marks complete
    return manifest


def ensure_tasks(prepared: PreparedData, cfg: BuildConfig, out_dir: str | Path) -> dict[str, Any]:
    """`write_tasks` unless `out_dir` already holds tasks built from the same inputs."""
    manifest_file = Path(out_dir) / MANIFEST
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        key = _key(prepared, cfg)
        if all(manifest.get(k) == v for k, v in key.items()) and all(
            (Path(out_dir) / f"{name}.jsonl").is_file()
            and "chance" in manifest.get("tasks", {}).get(name, {})  # older manifests lack it
            for name in TASK_NAMES
        ):
            return manifest
    return write_tasks(prepared, cfg, out_dir)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepared", required=True, help="prepared data directory")
    parser.add_argument("--out", required=True, help="directory for the .jsonl files")
    parser.add_argument("--seed", type=int, default=BuildConfig.seed)
    parser.add_argument("--examples", type=int, default=BuildConfig.examples)
    args = parser.parse_args(argv)
    try:
        prepared = load_prepared(args.prepared, verify_hashes=False)
    except DataPrepError as err:
        raise SystemExit(f"error: {err}") from err
    manifest = write_tasks(prepared, BuildConfig(seed=args.seed, examples=args.examples), args.out)
    for name, info in manifest["tasks"].items():
        print(f"{name:<16} {info['examples']:>6} examples  {Path(args.out) / name}.jsonl")


if __name__ == "__main__":
    main()
