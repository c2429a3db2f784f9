"""The dense-parameter probe's runs (run.sh) against the early-gap study's, paired by seed.

Each probe's final test loss over SCAPE-90 x4's (the same arm with every parameter sparse),
dense AdamS's and dense AdamW's (results/early_gap/runs, at the probe's horizon), with the bytes that
sending those parameters apart costs (their share of the model, from run.sh's copy of the
probe's ``DIAG`` lines), and the word embedding's share of the paper's models as the
reference assumes them. Writes probe.json beside this file and the ``probe`` block of
results/early_gap/README.md.

Usage: python results/early_gap/probe/compare.py [results/early_gap/probe/runs]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from pipelines.studies.report_prose import update_block
from pipelines.studies.run_index import RunIndex, RunKey, load_runs

HERE = Path(__file__).resolve().parent
STUDY = HERE.parent
DENSITY = 0.1  # SCAPE-90's

# The paper's models as the reference assumes them (layers, hidden, ffn, vocab padded, tied):
# the share of their word embedding, to price sending it whole at their scale
SHAPES = {"GPT-345M": (24, 1024, 4096, 50304, True), "Llama-500M": (24, 1280, 3456, 32000, False),
          "Llama-1.8B": (32, 2048, 5632, 32000, False)}  # fmt: skip
PARTS = (
    ("layernorm", "biases and norm weights"),
    ("word_embeddings", "word embedding"),
    ("position_embeddings", "position embedding"),
    ("output_layer", "output layer"),
)


def embedding_share(layers: int, hidden: int, ffn: int, vocab: int, tied: bool) -> float:
    """The word embedding's share of the params (attention 4 h^2; a GELU MLP 2 h f when tied
    (GPT), a SwiGLU one 3 h f and an output layer of its own when not (Llama))."""
    mlp = (2 if tied else 3) * hidden * ffn
    emb = vocab * hidden
    return emb / (layers * (4 * hidden * hidden + mlp) + emb * (1 if tied else 2))


def bytes_ratio(share: float, density: float, share_density: float = 1.0) -> float:
    """A run's bytes over a constant run's at ``density`` when ``share`` of the params travel
    at ``share_density`` instead (1: whole)."""
    return (share * share_density + (1.0 - share) * density) / density


def _finals(folder: Path) -> tuple[dict[tuple[str, int, int], float], set[str]]:
    """``(model, steps, seed) -> final test loss`` of the probe's stored runs, and the code
    versions (the patched step's) that made them."""
    runs = load_runs(folder / "runs")
    finals = {(r.header["model"], r.header["steps"], r.header["seed"]):
              float(r.final["final_test_loss"]) for r in runs}  # fmt: skip
    return finals, {str((r.header.get("code") or {}).get("step_code")) for r in runs}


def _probe(out: Path, name: str) -> dict:
    """``{"share", "k" (of 100; None: whole), "names"}`` of the parameters the probe sent
    apart, from run.sh's copy of its ``DIAG`` lines."""
    note = out / f"{name}.dense.txt"
    text = note.read_text() if note.exists() else ""
    found = re.search(r"\] (\d+) of (\d+)", text)  # "DIAG dense: [names] n of N"
    k = re.search(r"DIAG k (\d+)", text)
    return {"share": int(found[1]) / int(found[2]) if found else None,
            "k": int(k[1]) if k else None, "names": text.split("]", 1)[0]}  # fmt: skip


def _order(row: str) -> tuple[int, str]:
    """Table rows by horizon, then as written (model, what was sent apart)."""
    steps = row.split("|")[1].strip().replace(",", "")
    return int(steps), row


def main(out: Path) -> int:
    index = RunIndex.load(STUDY, None)
    rows, lines, versions = {}, [], set()
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        finals, made_by = _finals(folder)
        versions |= made_by
        if not finals:
            continue
        model, steps, _ = next(iter(finals))
        adams = index.lr_choice(model, "adams", steps)
        refs = {"scape90_x4": ("scape90", 4.0 * adams.lr), "adams": ("adams", adams.lr),
                "adamw": ("adamw", index.lr_choice(model, "adamw", steps).lr)}  # fmt: skip
        gaps: dict[str, list[float]] = {name: [] for name in refs}
        for (_, _, seed), loss in sorted(finals.items()):
            for name, (variant, lr) in refs.items():
                ref = index.runs[RunKey(model, variant, steps, lr, seed)].final["final_test_loss"]
                gaps[name].append(100.0 * (loss - ref) / ref)
        probe = _probe(out, folder.name)
        share, k = probe["share"], probe["k"]
        priced = (
            None if share is None else bytes_ratio(share, DENSITY, 1.0 if k is None else k / 100)
        )
        rows[folder.name] = {**{n: [round(x, 3) for x in v] for n, v in gaps.items()},
                             "share": share, "k": k, "bytes_ratio": priced}  # fmt: skip
        what = " and ".join(label for key, label in PARTS if key in probe["names"])
        sent = "whole" if k is None else f"at {k} of 100"
        cells = [f"{statistics.fmean(v):+.1f} ± {statistics.stdev(v):.1f}%" for v in gaps.values()]
        lines.append(f"| {steps:,} | {model} | {what}, {sent} | {'-' if share is None else f'{100 * share:.1f}%'} "
                     f"| {'-' if priced is None else f'x{priced:.2f}'} | {' | '.join(cells)} |")  # fmt: skip
    shares = []
    for model, shape in SHAPES.items():
        share = embedding_share(*shape)
        rows[model] = {"embedding_share": round(share, 4)}
        shares.append(f"{model} {100 * share:.1f}% (x{bytes_ratio(share, DENSITY):.2f} a constant "
                      f"SCAPE-90 run's bytes, x{bytes_ratio(share, 0.01):.2f} SCAPE-99's)")  # fmt: skip
    (HERE / "probe.json").write_text(json.dumps(rows, indent=1) + "\n")
    n = min(len(v["adams"]) for v in rows.values() if "adams" in v)
    block = "\n".join([
        "| steps | model | sent apart | share of params | bytes x constant | vs SCAPE-90 x4 | vs dense AdamS "
        "| vs dense AdamW |", "| --- | --- | --- | --- | --- | --- | --- | --- |", *sorted(lines, key=_order), "",
        f"Final test loss, paired over {n} seeds (mean ± sd), SCAPE-90 at x4 dense "
        "AdamS's lr with the named parameters in a bucket sent whole (or at k of 100) every step; "
        "`bash results/early_gap/probe/run.sh` (a patch on a scratch worktree, not a library "
        "option). The word embedding's share at the paper's scale (the reference's assumed "
        "shapes): " + "; ".join(shares) + f". Probe runs of the patched code versions "
        f"{', '.join(f'`{v}`' for v in sorted(versions))} (the same arithmetic: the later adds "
        f"only the k of 100), paired with the study's runs of `{index.code}`.",
    ])  # fmt: skip
    update_block(STUDY / "README.md", block, "probe")
    print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "runs"))
