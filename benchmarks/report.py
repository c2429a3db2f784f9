"""`make bench` (last step): ``results/bench/README.md`` from the benchmarks' JSON files.

Only reads JSON; every number in the README is in one of the files beside it. Sections
whose file is missing or skipped say so instead of failing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["render"]

MASK_PHASES = ("mask_select", "mask_send", "mask_wait", "mask_decode")
TARGETS = {
    "bytes99": 60.0,  # dense ZeRO-1 bf16 / SCAPE-99 at least this
    "bytes90": 7.0,
    "speedup_half_bytes": 0.5,  # measured speed-up / bytes ratio at least this (1 Gbit/s)
    "overhead_gpu": 0.10,  # SCAPE optimizer work / dense step compute at most this (GPU)
    "model_error": 0.15,  # |prediction error| at most this
}


NOTES = [
    "- Quiet-machine protocol (`benchmarks/quiet.py`, every benchmark entry point): a "
    "benchmark refuses to start beside a study, the tests or another benchmark; before each "
    "round it waits for the 1-min load to drop to 1.5; it records the load before and after "
    "each round and the CPU other processes used while it ran; a round with load above 1.5 "
    "before it, or with other processes using more than 0.25 cores, is re-run (at most twice) "
    "and otherwise kept and marked **noisy**. The load after a round includes the "
    "benchmark's own ranks (4 ranks on 2 cores make a load near 4 by themselves).",
    "- gloo's own `reduce_scatter_tensor` sends about twice the ring volume (wire / counted in "
    "section 2); NCCL rings do not. Section 2 times the real step, so both "
    "dense and SCAPE reduce-scatter with gloo's collective there; the communicator-level "
    "workload (appendix) uses a p2p ring (`benchmarks/ring.py`) instead.",
    "- On 2 CPU cores 4 ranks share the cores, so their compute is time-sliced: the 4-rank "
    "floor includes that, and the 4-rank speed-ups are not a scaling result.",
    "- SCAPE's optimizer-side work on a CPU is O(N) per rank, not only O(shard) (section 3); "
    "on a GPU these are memory-bound kernels, modeled in section 3, unverified here.",
    "- The projection and the break-even map assume one mask all-gather and one value "
    "reduce-scatter/all-gather per 40M-element bucket (45 buckets for Llama-1.8B at 32 ranks); "
    "at 10 us per ring step SCAPE's small collectives are latency-bound there, which a fused "
    "exchange (one collective per step) would remove.",
    "- Not done here: GPU measurements (no GPU in this session; `scripts/gpu_check.py` output "
    "is picked up by `make bench-project` when it exists).",
]


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def bytes_section(b: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
    if b is None:
        return ["_bytes.json missing: run `make bench-bytes`._"], {}
    m = b["measured"]
    lines = [
        f"Measured: {m['world_size']} gloo ranks, communicator-level workload (small Llama, "
        f"{m['n_params'] / 1e6:.2f}M params, shard {m['shard_size']:,}), bf16 values unless "
        "named fp32; counters of `scape.comm.SparseCommunicator` (ring accounting, per rank per "
        "step, median over measured steps). Overlap: |M_t ∩ M_t+1| / k, median of the second "
        "half of the run.",
        "",
    ]
    rows = []
    for name, e in m["methods"].items():
        bb = e["bytes_per_rank"]
        ov = e.get("mask_overlap_median_late")
        rows.append([name, _kb(bb.get("grad_values", 0)), _kb(bb.get("param_values", 0)),
                     _kb(bb.get("masks", 0)), _kb(e["total"]), f"{e['dense_over_this']:.1f}",
                     f"{e['this_over_value_limit']:.2f}", "" if ov is None else f"{ov:.3f}"])  # fmt: skip
    lines += _table(["method", "grad kB", "param kB", "masks kB", "total kB", "dense bf16 / this",
                     "this / values only", "mask overlap"], rows)  # fmt: skip
    src = b.get("overlap_source", {})
    overlaps = ", ".join(f"{float(k):.0%} density: {v:.3f} ({src.get(k, 'measured here')})"
                         for k, v in b["overlap_used_at_scale"].items())  # fmt: skip
    models = list(b["paper_scale"])
    lines += ["", "At paper scale, W=32 ranks, Megatron buckets of 40M, MB per rank per step "
              f"(dense AdamW = dense AdamS; the delta encoding sized with the mask overlap of "
              f"{overlaps}):", ""]  # fmt: skip
    rows = []
    for name, e in b["paper_scale"][models[-1]]["methods"].items():
        if name == "dense-adamw":
            continue
        rows.append([name, *(f"{b['paper_scale'][m]['methods'][name]['total'] / 1e6:,.1f}"
                             for m in models),
                     f"{e['dense_over_this']:.1f}", f"{e['this_over_value_limit']:.2f}"])  # fmt: skip
    lines += _table(["method", *models, f"dense bf16 / this ({models[-1]})", "this / values"], rows)
    variants = b.get("quality_study_overlap", {}).get("variants", {})
    if variants:
        by_name: dict[str, list[float]] = {}
        for run, overlap in variants.items():
            by_name.setdefault(run.split("__")[1], []).append(overlap)
        lines += ["", "Overlap of consecutive masks in the quality study's runs, late-training "
                  "median per variant (min-max over models and seeds): "
                  + ", ".join(f"{v} {min(o):.3f}-{max(o):.3f}" for v, o in sorted(by_name.items()))
                  + ". The delta pays only for the first-moment mask; masks that rotate (age "
                  "term, residual or raw-gradient statistics) change almost entirely each step, "
                  "where the delta costs slightly more than offset16 and a fall-back would be "
                  "needed."]  # fmt: skip
    lines += ["", *megatron_bytes_lines(b.get("megatron"))]
    best = {}
    scale = b["paper_scale"][models[-1]]["methods"]
    for label in ("90", "99"):
        cands = {n: e["dense_over_this"] for n, e in m["methods"].items()
                 if n.startswith(f"scape-{label}-")}  # fmt: skip
        fixed = {n: v for n, v in cands.items() if not n.endswith("delta")}
        best[label] = {"best_fixed": max(fixed.items(), key=lambda kv: kv[1]),
                       "delta": cands.get(f"scape-{label}-delta"),
                       "delta_at_scale": scale[f"scape-{label}-delta"]["dense_over_this"],
                       "scale_model": models[-1]}  # fmt: skip
    return lines, best


def megatron_bytes_lines(mg: dict[str, Any] | None) -> list[str]:
    """Bytes read from real multi-rank Megatron runs, beside the communicator-level ones."""
    if not mg:
        return ["_No Megatron byte run recorded._"]
    if "error" in mg:
        return [f"**Megatron byte run failed:** `{mg['error'][:300]}`"]
    lines = [f"Read from real {mg['world_size']}-rank Megatron runs ({mg['note']}; "
             f"{mg['n_params']:,} params, buffer {mg['padded']:,}). On CPU the model is fp32 and "
             "Megatron reduces grads in fp32, so dense values are 4 bytes here; SCAPE sends bf16 "
             "grads and its params in the buffer's dtype (fp32 here, bf16 in a bf16 run). Dense "
             "bytes are counted by a tap on the collectives Megatron calls; SCAPE's by its own "
             "counter.", ""]  # fmt: skip
    dense = mg["methods"].get("dense-adams", {})
    # Mixed dtypes on a CPU run (dense fp32; SCAPE bf16 grads, fp32 params): the ratio is
    # against this run's dense, the byte counts are what matters for checking the accounting.
    dense_total = dense.get("grad_values", 0.0) + dense.get("param_values", 0.0)
    rows = []
    for name, bb in mg["methods"].items():
        total = sum(bb.get(k, 0.0) for k in ("grad_values", "param_values", "masks"))
        rows.append([name, _kb(bb.get("grad_values", 0)), _kb(bb.get("param_values", 0)),
                     _kb(bb.get("masks", 0)), f"{bb.get('scalars', 0):.0f}", _kb(total),
                     f"{dense_total / total:.1f}" if total else ""])  # fmt: skip
    return lines + _table(["method (Megatron)", "grad kB", "param kB", "masks kB", "scalars B",
                           "total kB", "dense fp32 (this run) / this"], rows)  # fmt: skip


def cluster_section(c: dict[str, Any] | None) -> list[str]:
    """Appendix: what the communicator-level workload still explains (the one-step mask delay,
    gloo's reduce-scatter volume); its step times are superseded by section 2."""
    if c is None:
        return ["_cluster.json missing: `make bench-cluster` (as root) writes it._"]
    if "skipped" in c:
        return [f"**Skipped:** {c['skipped']}"]
    loads = [x for cfg in c["configs"] for x in cfg.get("loadavg", [])]
    noisy = any((cfg.get("quiet") or {}).get("noisy") for cfg in c["configs"])
    lines = [
        f"`make bench-cluster` (not part of `make bench`): the communicator-level workload "
        f"(small Llama {c['configs'][0]['n_params'] / 1e6:.2f}M params, {c['model']['seq']} "
        "tokens per rank per step, flat ZeRO-1 buffer, `scape.comm` + `scape.shard`, p2p ring "
        "reduce-scatter, bf16 values), kept only for what it explains. Its step times are "
        "superseded by section 2.",
        "",
    ]
    if loads and (max(loads) > 1.5 or noisy):
        lines += [f"**Measured on a busy machine** (1-min load {min(loads):.1f}-{max(loads):.1f}): "
                  "read these as what the machine gave, not as costs.", ""]  # fmt: skip
    fits, delay = [], []
    for cfg in c["configs"]:
        label = f"{cfg['world_size']} x {cfg['link']['label']}"
        load = " / ".join(f"{x:.1f}" for x in cfg.get("loadavg", []))
        for est, f in cfg["fits"].items():
            fits.append([label, est, f"{f['reduce_scatter']['alpha_us']:.0f}",
                         f"{f['reduce_scatter']['bandwidth_MBps']:.0f}",
                         f"{f['all_gather']['alpha_us']:.0f}", f"{f['all_gather']['bandwidth_MBps']:.0f}",
                         f"{cfg['wire_over_counted_bytes']:.3f}" if cfg["wire_over_counted_bytes"] else "",
                         load, f"{cfg['seconds']:.0f}"])  # fmt: skip
        for d in ("90", "99"):
            on, off = cfg["methods"].get(f"scape-{d}"), cfg["methods"].get(f"scape-{d}-sync")
            if on and off:
                exposed = tuple(sum(m["phases_s"][p] for p in MASK_PHASES) for m in (off, on))
                delay.append([label, f"scape-{d}",
                              f"{off['step_s'] * 1e3:.0f} / {off['step_s_best'] * 1e3:.0f}",
                              f"{on['step_s'] * 1e3:.0f} / {on['step_s_best'] * 1e3:.0f}",
                              f"{exposed[0] * 1e3:.0f}", f"{exposed[1] * 1e3:.0f}",
                              f"{off['step_s_best'] / on['step_s_best']:.2f}", load])  # fmt: skip
    lines += ["What the one-step mask delay buys (same runs): the mask made and exchanged "
              "on the critical path (`sync`) against made at the end of the previous step and "
              "all-gathered behind what follows. Mask ms = selection, encoding, exposed wait and "
              "decoding on the critical path (medians): the delay hides only the exchange, "
              "against the selection and decoding work a CPU does either way.", ""]  # fmt: skip
    lines += _table(["ranks x link", "method", "sync step ms median / best",
                     "delayed step ms median / best", "sync mask ms", "delayed mask ms",
                     "gain (best)", "load before / after"], delay)  # fmt: skip
    lines += ["", "Calibration (alpha-beta fits of bare ring collectives per estimator; "
              "wire/counted = bytes the interfaces sent over bytes the counters booked, whole "
              "run; load = 1-min load average before/after):", ""]  # fmt: skip
    lines += _table(["ranks x link", "estimator", "RS alpha us", "RS MB/s", "AG alpha us",
                     "AG MB/s", "wire/counted", "load", "seconds"], fits)  # fmt: skip
    return lines


STEP_TARGETS = {  # issue 14's done-means, measured on the Megatron step (1 Gbit/s)
    "scape99_w2": 5.0,
    "scape99_w2_over_floor": 1.25,
    "scape99_w4": 3.5,
    "scape90_w2": 2.5,
}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"x{x:.2f}"


def _loadavg(p: dict[str, Any]) -> str:
    if p.get("load_before") is None:
        return "-"
    return f"{p['load_before']:.2f} / {p['load_after']:.2f}" + (
        " **noisy**" if p.get("noisy") else ""
    )


def step_section(doc: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
    """Section 2: the pretrain stage's Megatron step on the emulated cluster."""
    if doc is None:
        return ["_Not measured yet: `make bench-step` (as root, on a quiet machine) writes "
                "megatron_step.json._"], {}  # fmt: skip
    if "skipped" in doc:
        return [f"**Skipped:** {doc['skipped']}"], {}
    rounds, points = doc["rounds"], doc.get("points", [])
    info = next((r["methods"] for r in rounds.values() if r.get("methods")), {})
    buckets = ", ".join(f"{n} {m.get('buckets')}" for n, m in info.items())
    bucket = next((o for o in doc.get("bench_model") or [] if o.startswith("train.bucket_size")),
                  "Megatron's default buckets")  # fmt: skip
    any_m = next(iter(info.values()), {})
    lines = [
        "`make bench-step` (`python -m benchmarks.megatron_step`; started "
        f"{doc.get('started_at', '?')}, {'complete' if doc.get('complete') else '**incomplete**'}"
        f"{'' if doc.get('mode') == 'netns' else ', **' + str(doc.get('mode')) + '**'}). Each "
        "method is a pretrain-stage configuration built and stepped by the stage's own engine "
        "(`pipelines.training.engine.build_engine`, the trainer's schedule and data); the time "
        "is that of `engine.step`, which the trainer logs as `step_time`. Ranks in network "
        "namespaces behind `tc tbf` links; methods interleaved step by step in one launch per "
        "round; a step counts at its slowest rank; median and quartiles over "
        f"{doc.get('steps')} measured steps per method after {doc.get('warmup')} left out. "
        f"Model: {any_m.get('model', '?')}, {any_m.get('n_params', 0) / 1e6:.1f}M parameters, "
        f"{any_m.get('tokens_per_rank_step', '?')} tokens per rank per step, fp32 on CPU "
        "(dense AdamS moves 8 bytes per parameter per rank and step: fp32 gradients "
        f"reduce-scattered, fp32 parameters all-gathered), `{bucket}` (buckets per step: "
        f"{buckets}). "
        "Dense with and without Megatron's overlap of gradient reduce-scatters with backward "
        "(`train.overlap_grad_reduce`); SCAPE-90/99 as `optimizer=scape90|scape99` configure "
        "them (overlap on, one-step mask delay). The model is small and the batch a few tokens "
        "so that, as in the paper's communication-bound setting, dense AdamS's exchange is a "
        "large part of its step at 1 Gbit/s; the three links put the dense step on both sides "
        "of break-even (comm / compute column).",
        "",
        "**Floor** (compute-only): the same steps of the same methods with the same number of "
        "ranks running at once on this machine's cores, in PyTorch's fake process group: every "
        "collective returns at once, locally. It includes forward, backward, Megatron's bucket "
        "bookkeeping, SCAPE's selection, packing and decoding, the optimizer update and the "
        "local copies the collectives' outputs need; it excludes every transfer, every "
        "reduction across ranks and every wait for another rank (`benchmarks/step_rank.py`).",
        "",
    ]
    floors = []
    for name, rnd in rounds.items():
        if rnd.get("mode") != "floor":
            continue
        if "error" in rnd:
            floors.append([name, "error", rnd["error"].splitlines()[0][:120], "", "", "", ""])
            continue
        fb = rnd.get("fwd_bwd") or {}
        q = rnd.get("quiet") or {}
        for m, e in rnd["methods"].items():
            floors.append([f"{rnd['world_size']}", m, f"{_ms(e['step_s'])} [{_ms(e['step_s_p25'])}-{_ms(e['step_s_p75'])}]",
                           _ms(fb.get("forward_s")), _ms(fb.get("backward_s")),
                           _loadavg(q), f"{rnd.get('seconds', 0):.0f}"])  # fmt: skip
    lines += _table(["ranks", "method", "floor ms median [quartiles]", "forward ms (dense)",
                     "backward ms (dense)", "load before / after", "round s"], floors)  # fmt: skip
    rows, status = [], {}
    for p in points:
        err = p.get("model_error")
        wire = (p["wire_bytes_per_rank"] / p["bytes_per_rank"]
                if p.get("wire_bytes_per_rank") and p.get("bytes_per_rank") else None)  # fmt: skip
        rows.append([f"{p['world_size']} x {p['link']}", p["method"],
                     f"{_ms(p['step_s'])} [{_ms(p['step_s_p25'])}-{_ms(p['step_s_p75'])}]",
                     _ms(p.get("floor_s")), "-" if p.get("step_over_floor") is None else f"{p['step_over_floor']:.2f}",
                     f"{_x(p.get('speedup_vs_best_dense'))} / {_x(p.get('speedup_vs_dense-no-overlap'))} / "
                     f"{_x(p.get('speedup_vs_dense-overlap'))}",
                     "-" if p.get("comm_over_compute") is None else f"{p['comm_over_compute']:.2f}",
                     _kb(p["bytes_per_rank"]), "-" if wire is None else f"{wire:.2f}",
                     "-" if err is None else f"{_ms(p['predicted']['total'])} ({err:+.0%})",
                     _loadavg(p)])  # fmt: skip
        if err is not None:
            status.setdefault("errors", []).append((abs(err), p))
        status[(p["world_size"], p["link"], p["method"])] = p
    lines += ["", "Per link: the step (median [quartiles]), its floor, the speed-up against dense "
              "AdamS (median of same-step ratios: against the faster of the two dense variants at "
              "each step / without overlap / with overlap), exposed time over compute "
              "((step - floor) / floor), bytes per rank per step as the engines count them (ring "
              "accounting) and as the interfaces sent them (wire / counted), the cost model, and "
              "the 1-min load average before and after the round.", ""]  # fmt: skip
    lines += _table(["ranks x link", "method", "step ms [quartiles]", "floor ms", "step / floor",
                     "speed-up vs dense: faster / no overlap / overlap", "comm / compute",
                     "kB/rank counted", "wire / counted", "model ms (error)",
                     "load before / after"], rows)  # fmt: skip
    fits = []
    for name, rnd in rounds.items():
        if rnd.get("mode") != "cluster":
            continue
        if "error" in rnd:
            fits.append([name, "error: " + rnd["error"].splitlines()[0][:150], "", "", "", "", ""])
            continue
        f, q = rnd.get("fits"), rnd.get("quiet") or {}
        tries = len(q.get("attempts", []))
        fits.append([name, *(("-", "-", "-", "-") if not f else
                             (f"{f['reduce_scatter']['alpha_us']:.0f}", f"{f['reduce_scatter']['bandwidth_MBps']:.0f}",
                              f"{f['all_gather']['alpha_us']:.0f}", f"{f['all_gather']['bandwidth_MBps']:.0f}")),
                     f"{q.get('other_cores', 0):.2f}", f"{tries}", _loadavg(q), f"{rnd.get('seconds', 0):.0f}"])  # fmt: skip
    lines += ["", "Calibration and protocol per round: alpha-beta fits of bare gloo collectives "
              "timed in the same namespaces (median per size; what the cost model uses), other "
              "processes' CPU while the round ran (cores), tries (a disturbed round is re-run), "
              "load and duration. gloo's own reduce-scatter sends about twice the ring's volume "
              "(wire / counted above); NCCL's ring does not, so on GPUs both methods' reduce-"
              "scatters cost less than here.", ""]  # fmt: skip
    lines += _table(["round", "RS alpha us", "RS MB/s", "AG alpha us", "AG MB/s",
                     "other cores", "tries", "load before / after", "round s"], fits)  # fmt: skip
    if doc.get("not_run"):
        lines += [
            "",
            "Not run: " + ", ".join(f"{n['round']} ({n['why']})" for n in doc["not_run"]) + ".",
        ]
    return lines, status


def overhead_section(
    o: dict[str, Any] | None, proj: dict[str, Any] | None
) -> tuple[list[str], dict]:
    if o is None:
        return ["_overhead.json missing: run `make bench-overhead`._"], {}
    lines = [f"One Megatron bucket as a rank sees it (W={o['world_size']}, bucket {o['bucket']:,}, "
             f"shard {o['shard']:,}: the shard size of every model at W=32); medians, SCAPE and "
             "dense parts alternating. Per step = per bucket x buckets "
             f"({o['buckets_per_model']}).", ""]  # fmt: skip
    if "gpu_skipped" in o:
        lines += [f"**GPU: skipped** ({o['gpu_skipped']}).", ""]
    rows = []
    for d in o["devices"].values():
        for label in ("scape-90", "scape-99"):
            m = d[label]
            parts = ", ".join(f"{k.split('.')[1]} {v * 1e3:.0f}" for k, v in m["median_s"].items()
                              if k.startswith("scape."))  # fmt: skip
            dparts = ", ".join(f"{k.split('.')[1]} {v * 1e3:.0f}" for k, v in m["median_s"].items()
                               if k.startswith("dense."))  # fmt: skip
            rows.append([d["name"], label, f"{m['scape_total_s'] * 1e3:.0f} ({parts})",
                         f"{m['dense_total_s'] * 1e3:.0f} ({dparts})",
                         f"{m['scape_over_dense_total']:.2f}",
                         f"{m['per_step_s']['llama-1.8b']['scape']:.2f}",
                         _loadavg(m.get("quiet") or {})])  # fmt: skip
    lines += _table(["device", "method", "SCAPE ms/bucket (parts)", "dense ms/bucket (parts)",
                     "SCAPE / dense", "SCAPE s/step Llama-1.8B", "load before / after"], rows)  # fmt: skip
    status: dict[str, Any] = {}
    if proj is not None:
        m18 = proj["models"]["llama-1.8b"]
        for label in ("scape-90", "scape-99"):
            status[label] = m18["scape"][label]["optimizer_s"] / m18["compute_s"]
        lines += ["", "GPU, modeled (no GPU here): memory traffic of each part / (4 TB/s x 0.6): "
                  f"SCAPE-99 {m18['scape']['scape-99']['optimizer_s'] * 1e3:.1f} ms, SCAPE-90 "
                  f"{m18['scape']['scape-90']['optimizer_s'] * 1e3:.1f} ms per Llama-1.8B step, "
                  f"against {m18['compute_s'] * 1e3:.0f} ms of modeled dense compute "
                  f"({m18['tokens_per_gpu']:,} tokens/GPU): "
                  f"{status['scape-99']:.1%} / {status['scape-90']:.1%}."]  # fmt: skip
    return lines, status


def _calibration_note(cal: Any) -> str:
    if isinstance(cal, dict):
        return f"MFU {cal['mfu']:.1%} and kernels from {cal['file']} ({cal['gpu']})"
    return str(cal or "none")


def projection_section(p: dict[str, Any] | None) -> list[str]:
    if p is None:
        return ["_projection.json missing: run `make bench-project`._"]
    a = p["assumptions"]
    lines = [f"32 GH200 nodes, one GPU each; NDR {a['link_gbit']:.0f} Gbit/s x {a['link_efficiency']} "
             f"= {a['link_gbit'] * a['link_efficiency'] / 8:.0f} GB/s per rank, alpha {a['alpha_us']:.0f} us "
             f"per ring step; compute = FLOPs / ({a['peak_tflops']:.0f} TFLOP/s x MFU {a['mfu']}); "
             f"{a['tokens_per_gpu']:,} tokens/GPU/step; optimizer work {p['optimizer_source']}; "
             f"GPU calibration: {_calibration_note(p.get('gpu_calibration'))}. "
             "`no overlap`: every exchange after backward (as the emulated runs); `overlap`: "
             "both methods hide their value exchange behind compute (Megatron's overlap).", ""]  # fmt: skip
    rows = []
    for model, m in p["models"].items():
        d = m["dense_step_s"]
        for label, s in m["scape"].items():
            if label.endswith("-delta"):
                continue  # the mask exchange is hidden either way: same step time
            rows.append([model, label, f"{m['compute_s'] * 1e3:.0f}", f"{d['no_overlap'] * 1e3:.0f}",
                         f"{s['step_s']['no_overlap'] * 1e3:.0f}", f"{s['speedup_no_overlap']:.2f}",
                         f"{s['saving_no_overlap']:.1%}", f"{s['speedup_full_overlap']:.2f}"])  # fmt: skip
    lines += _table(["model", "method", "compute ms", "dense ms", "SCAPE ms", "speed-up",
                     "time saved", "speed-up (overlap)"], rows)  # fmt: skip
    sweep = p["speedup_vs_tokens_per_gpu_no_overlap"]["llama-1.8b"]
    lines += ["", "Llama-1.8B SCAPE-99 speed-up (no overlap) against tokens per GPU per step: "
              + ", ".join(f"{int(t):,}: x{v['scape-99']:.2f}" for t, v in sweep.items())
              + f". Paper: x{p['paper']['speedup_llama_1_8b']} (Llama-1.8B), "
              f"{p['paper']['wallclock_saving_llama_500m']:.1%} less wall-clock (Llama-500M)."]  # fmt: skip
    return lines


def peers_section(peers_dir: Path) -> list[str]:
    """The peers study's table (same model, data, ranks and schedule as one another)."""
    table = peers_dir / "peers.md"
    if not table.is_file():
        return ["Not run yet: `make bench-peers-cluster`, then `make peers-study`."]
    loads = []
    for path in sorted(peers_dir.glob("cluster*.json")):
        doc = json.loads(path.read_text())
        run_loads = [x for r in doc.get("runs", []) for x in (r.get("loadavg") or [])]
        if run_loads:
            loads.append(f"{doc['link']['label']}: {min(run_loads):.1f}-{max(run_loads):.1f}")
    return [
        "Whole pretrain-stage runs of `experiment=peers_gpt345m_owt scale=tiny` (tiny GPT, 2 gloo "
        "ranks); step times from `make bench-peers-cluster`, losses and bytes from `make "
        "peers-study`. Details and the figure: [results/peers/README.md](../peers/README.md). "
        + (
            f"1-min load average over the step-time runs (before/after each): {'; '.join(loads)}."
            if loads
            else ""
        ),  # fmt: skip
        "",
        *table.read_text().rstrip("\n").splitlines(),
    ]


def break_even_section(bench_dir: Path) -> list[str]:
    """The break-even map: figure, the table behind it, and in words which settings the
    paper's x3.26 needs (``make bench-break-even``)."""
    from benchmarks.break_even import in_words

    summary = _load(bench_dir / "break_even.json")
    md = bench_dir / "break_even.md"
    if summary is None or not md.is_file():
        return ["_Not rendered yet: `make bench-break-even` writes break_even.{png,md,csv,json}._"]
    a = summary["assumptions"]
    table = md.read_text().splitlines()
    first = next(i for i, ln in enumerate(table) if ln.startswith("| tokens per GPU per step"))
    last = next(i for i in range(first, len(table)) if not table[i].startswith("|"))
    return [
        "![break-even map](break_even.png)",
        "",
        f"`make bench-break-even` (`python -m benchmarks.break_even`): the projection above for "
        f"{summary['model']} on {summary['world_size']} ranks, over per-rank link bandwidth "
        f"(1-400 Gbit/s, the rings reaching {a['link_efficiency']:.0%} of it, {a['alpha_us']:.0f} us "
        f"per ring step) x tokens per GPU per step (1k-32k; compute = model FLOPs / "
        f"({a['peak_tflops']:.0f} TFLOP/s x MFU {a['mfu']}), i.e. {a['peak_tflops'] * a['mfu']:.0f} "
        "TFLOP/s achieved per GH200), without and with overlap (as above). Red: SCAPE-99 at the "
        "paper's x3.26; dashed orange: SCAPE-90 at x3.26; dotted: the cells whose dense "
        "communication / compute equals an emulated round's (section 2), and on the right each "
        "emulated round at its own ratio against the projected curve (hollow: noisy). Every cell: "
        "`break_even.csv`; the tables: [`break_even.md`](break_even.md).",
        "",
        in_words(summary),
        "",
        "Highest per-rank link bandwidth (Gbit/s) at which the projected speed-up still "
        "reaches x3.26:",
        "",
        *table[first:last],
    ]


def step_targets(status: dict[str, Any]) -> list[list[str]]:
    """Issue 14's done-means against section 2's points."""
    rows = []

    def point(w: int, method: str) -> dict[str, Any] | None:
        return status.get((w, "1gbit", method))

    def sp(p: dict[str, Any]) -> str:
        return (f"{_x(p.get('speedup_vs_best_dense'))} against the faster dense (no overlap "
                f"{_x(p.get('speedup_vs_dense-no-overlap'))}, overlap "
                f"{_x(p.get('speedup_vs_dense-overlap'))}); load {_loadavg(p)}")  # fmt: skip

    for w, method, key, goal_text in (
        (2, "scape-99", "scape99_w2", "2 ranks, 1 Gbit/s: SCAPE-99 >= x{g:g} faster than dense AdamS"),
        (4, "scape-99", "scape99_w4", "4 ranks, 1 Gbit/s: SCAPE-99 >= x{g:g}"),
        (2, "scape-90", "scape90_w2", "2 ranks, 1 Gbit/s: SCAPE-90 >= x{g:g}"),
    ):  # fmt: skip
        goal, p = STEP_TARGETS[key], point(w, method)
        if p is None or p.get("speedup_vs_best_dense") is None:
            rows.append([goal_text.format(g=goal), "not measured (`make bench-step`)", "-"])
            continue
        ok = p["speedup_vs_best_dense"] >= goal
        rows.append([goal_text.format(g=goal), sp(p),
                     ("met" if ok else "not met") + (" (noisy)" if p.get("noisy") else "")])  # fmt: skip
    p, goal = point(2, "scape-99"), STEP_TARGETS["scape99_w2_over_floor"]
    text = f"2 ranks, 1 Gbit/s: SCAPE-99 step <= {goal:g}x its compute-only floor"
    if p is None or p.get("step_over_floor") is None:
        rows.append([text, "not measured (`make bench-step`)", "-"])
    else:
        rows.append([text, f"{p['step_over_floor']:.2f}x ({_ms(p['step_s'])} ms / {_ms(p['floor_s'])} ms)",
                     ("met" if p["step_over_floor"] <= goal else "not met")
                     + (" (noisy)" if p.get("noisy") or p.get("floor_noisy") else "")])  # fmt: skip
    errs = status.get("errors")
    text = "cost model within 15% of every measured point (median)"
    if not errs:
        rows.append([text, "not measured (`make bench-step`)", "-"])
    else:
        within = sum(e <= TARGETS["model_error"] for e, _ in errs)
        worst, wp = max(errs, key=lambda ep: ep[0])
        rows.append([text, f"{within}/{len(errs)} within; worst {worst:.0%} "
                     f"({wp['world_size']} x {wp['link']} {wp['method']})",
                     "met" if worst <= TARGETS["model_error"] else "not met"])  # fmt: skip
    return rows


def render(bench_dir: Path) -> str:
    b = _load(bench_dir / "bytes.json")
    c = _load(bench_dir / "cluster.json")
    o = _load(bench_dir / "overhead.json")
    p = _load(bench_dir / "projection.json")
    step = _load(bench_dir / "megatron_step.json")
    bytes_lines, best = bytes_section(b)
    step_lines, sst = step_section(step)
    overhead_lines, ost = overhead_section(o, p)
    targets = []
    if best:
        for label, goal in (("99", TARGETS["bytes99"]), ("90", TARGETS["bytes90"])):
            name, ratio = best[label]["best_fixed"]
            delta = best[label]["delta"]
            ok = max(ratio, delta or 0) >= goal
            at_scale = best[label]["delta_at_scale"]
            targets.append([f"bytes at {label}% sparsity <= 1/{goal:g} of dense ZeRO-1 bf16",
                            f"1/{ratio:.1f} ({name}); delta 1/{delta:.1f} measured, 1/{at_scale:.1f} "
                            f"at {best[label]['scale_model']} scale with the long-run overlap",
                            "met" if ok else "not met"])  # fmt: skip
    targets += step_targets(sst)
    if ost:
        targets.append(["SCAPE optimizer work <= 10% of dense compute, Llama-1.8B, GPU",
                        f"not measured (no GPU); modeled {ost['scape-99']:.1%} (99%), {ost['scape-90']:.1%} (90%)",
                        "unverified"])  # fmt: skip
    head = [
        "# Performance benchmarks (issues 6, 14)",
        "",
        f"Rendered by `make bench-report` (the last step of `make bench`) on "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC from the JSON files beside it; "
        f"{os.cpu_count()} CPU cores, {platform.python_version()}, torch {torch.__version__}, "
        f"no GPU{'' if not torch.cuda.is_available() else ' (GPU present)'}. Raw numbers: "
        "`bytes.json`, `megatron_step.json`, `overhead.json`, `projection.json`, "
        "`break_even.json`, `cluster.json` beside this file. Every timing carries the 1-min "
        "load average before and after its round (quiet-machine protocol, see the notes).",
        "",
        "**What ran:** section 2's step times are the pretrain stage's own Megatron-Core train "
        "step (dense AdamS, SCAPE-90, SCAPE-99 as `optimizer=` configures them) on the emulated "
        "cluster (`benchmarks/megatron_step.py`); the first byte table comes from the "
        "communicator-level workload (`benchmarks/workloads.py`), the second from 2-rank runs of "
        "Megatron's train step (`benchmarks/megatron_workload.py`); the appendix keeps what the "
        "communicator-level cluster runs still explain.",
        "",
        "## Targets",
        "",
        *_table(["target", "where we stand", "status"], targets),
        "",
        "## 1. Bytes per rank per step",
        "",
        *bytes_lines,
        "",
        "## 2. The Megatron train step on an emulated cluster",
        "",
        *step_lines,
        "",
        "## 3. Optimizer-side work",
        "",
        *overhead_lines,
        "",
        "## 4. Projection to 32 GH200 nodes, and where SCAPE pays",
        "",
        *projection_section(p),
        "",
        *break_even_section(bench_dir),
        "",
        "## 5. Peers: PowerSGD, DGC-style top-k, 1-bit-Adam-style (issue 8)",
        "",
        *peers_section(bench_dir.parent / "peers"),
        "",
        "## Appendix: the communicator-level workload on the emulated cluster",
        "",
        *cluster_section(c),
        "",
        "## Findings and caveats",
        "",
        *NOTES,
        "",
    ]
    return "\n".join(head)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    out = args.bench_dir / "README.md"
    out.write_text(render(args.bench_dir))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
