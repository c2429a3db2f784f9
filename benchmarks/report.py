"""`make bench-report` (the last step of `make bench`): ``results/bench/README.md`` from the JSON.
Every figure is read from a file beside it; a section whose file is missing says how to make it."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.break_even import in_words
from benchmarks.bytes import RUN_STEPS
from benchmarks.harness import cli
from benchmarks.harness.paper import SCAPE_STEP
from benchmarks.harness.records import Point, Sweep, from_json
from benchmarks.megatron_step import PARTS

__all__ = ["TARGETS", "main", "render"]

WIRE = {"float32": "fp32", "bfloat16": "bf16"}  # a values' dtype as the tables name it
TARGETS = {
    "bytes99": 60.0,  # dense ZeRO-1 bf16 / SCAPE-99 bytes at paper scale, at least
    "bytes90": 7.0,
    "scape99_w2": 5.0,  # speed-up over the faster dense AdamS at 1 Gbit/s, at least
    "scape99_w4": 3.5,
    "scape90_w2": 2.5,
    "scape99_w2_over_floor": 1.25,  # SCAPE-99's step over its compute-only floor, at most
    "model_error": 0.15,  # |cost model / measured - 1| at every point, at most
    "overhead_gpu": 0.10,  # SCAPE's optimizer work / dense compute on a GPU, at most
}
NOT_RUN = "not measured at this commit (`make bench-step`)"
SWEEP_NOT_RUN = ("The step sweep has not been run at this commit: `make bench-step` (as root, on "
                 "a quiet machine; `ALLOW_BUSY=1` runs it beside other work, disturbed rounds "
                 "marked noisy) writes megatron_step.json, then `make bench-report` fills this "
                 "section. Sweeps of older commits: [archive/](archive/README.md).")  # fmt: skip


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]  # fmt: skip


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"x{x:.2f}"


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def _load_cell(q: Any) -> str:
    """Load before / after a round, and noisy; ``q``: a quiet record (dict) or a point."""
    get = q.get if isinstance(q, dict) else lambda k: getattr(q, k, None)
    if get("load_before") is None:
        return "-"
    noisy = " **noisy**" if get("noisy") else ""
    return f"{get('load_before'):.2f} / {get('load_after'):.2f}{noisy}"


def bytes_section(b: dict[str, Any] | None, wire: str) -> list[str]:
    if b is None:
        return ["_bytes.json missing: run `make bench-bytes`._"]
    m, kinds = b["measured"], ("grad_values", "param_values", "masks")
    rows = [[name, *(_kb(e["bytes_per_rank"].get(k, 0)) for k in kinds), _kb(e["total"]),
             f"{e['dense_over_this']:.1f}", f"{e['this_over_value_limit']:.2f}",
             {True: "=", False: "**differs**"}.get(e.get("matches_formula"), "")]
            for name, e in m["methods"].items()]  # fmt: skip
    scale = b["paper_scale"]
    models, last = list(scale), scale[list(scale)[-1]]
    paper = [[name, *(f"{scale[mm]['methods'][name]['total'] / 1e6:,.1f}" for mm in models),
              f"{e['dense_over_this']:.1f}", f"{e['this_over_value_limit']:.2f}"]
             for name, e in last["methods"].items()]  # fmt: skip
    return [f"Counted: {m['world_size']} gloo ranks on loopback, Megatron's train step "
            f"(`benchmarks/harness/bytecount.py`: a small Llama, {m['n_params'] / 1e6:.2f}M "
            f"parameters, {b['model']['seq']} tokens per rank per step, {len(m['shard_sizes'])} "
            "buckets); per rank per step, ring accounting, median over the measured steps. Dense: "
            "a tap on Megatron's collectives (fp32 on CPU); SCAPE: its own counter, checked "
            "against `scape.comm.step_bytes_per_rank` (formula).", "",
            *_table(["method", "grad kB", "param kB", "masks kB", "total kB",
                     "dense fp32 (this run) / this", "this / values only", "formula"], rows), "",
            f"At paper scale (formula), W={last['world_size']}, Megatron's buckets, MB per rank "
            f"per step; dense ZeRO-1 in bf16, SCAPE with bf16 and with fp32 values ({WIRE[wire]} "
            "ones are what the SCAPE configs send) in its steady sparse step; "
            "`scape-99-shipped-run`: the shipped SCAPE-99's mean per step over a run of "
            f"{RUN_STEPS:,} steps (its dense first step and its density ramp from 90% over the "
            "first 15% counted):",
            "", *_table(["method", *models, f"dense bf16 / this ({models[-1]})", "this / values"],
                        paper)]  # fmt: skip


def step_section(sweep: Sweep | None) -> list[str]:
    if sweep is not None and sweep.skipped:
        return [f"**Skipped:** {sweep.skipped}", "", SWEEP_NOT_RUN]
    if sweep is None or not sweep.rounds:
        return [SWEEP_NOT_RUN]
    info = next(m for r in sweep.rounds.values() for m in r.methods.values())
    rows = [[f"{p.world_size} x {p.link}", p.method,
             f"{_ms(p.step_s)} [{_ms(p.step_s_p25)}-{_ms(p.step_s_p75)}]", _ms(p.floor_s),
             "-" if p.step_over_floor is None else f"{p.step_over_floor:.2f}",
             f"{_x(p.speedup_vs_best_dense)} / {_x(p.speedup_vs_no_overlap)} / {_x(p.speedup_vs_overlap)}",
             "-" if p.comm_over_compute is None else f"{p.comm_over_compute:.2f}", _kb(p.bytes_per_rank),
             "-" if p.predicted is None else f"{_ms(p.predicted['total'])} ({p.model_error:+.0%})",
             _load_cell(p)] for p in sweep.points]  # fmt: skip
    rounds = [[name, r.error.splitlines()[0][:150] if r.error else "ok",
               str(len(r.quiet.attempts)) if r.quiet else "-", _load_cell(r.quiet or {}),
               f"{r.quiet.other_cores:.2f}" if r.quiet else "-",
               f"{r.quiet.host_ms_before:.0f} / {r.quiet.host_ms_after:.0f}" if r.quiet else "-",
               f"{_ms(r.forward_s)} / {_ms(r.backward_s)}", f"{r.seconds:.0f}"]
              for name, r in sweep.rounds.items()]  # fmt: skip
    return [f"`make bench-step` at commit {sweep.commit}, started {sweep.started_at}"
            f"{'' if sweep.complete else ', **incomplete**'}{', **loopback**' if sweep.loopback else ''}: "
            "`engine.step` of the pretrain stage (the trainer's `step_time`) at the slowest rank, "
            f"median [quartiles] of {sweep.steps} steps after {sweep.warmup}, each method in rank "
            f"processes of its own; {info.model}, {info.n_params / 1e6:.1f}M parameters, "
            f"{info.tokens_per_rank_step} tokens per rank per step, fp32. Floor: the same steps in "
            "PyTorch's fake process group (no transfer, no wait), right after them. Speed-up: "
            "median of same-step ratios against dense AdamS (the faster of the two / without / "
            "with Megatron's overlap). Model: the floor plus each collective's exposed time, timed "
            "bare at the step's size (`benchmarks/megatron_step.py`).", "",
            *_table(["ranks x link", "method", "step ms", "floor ms", "step / floor",
                     "speed-up: faster dense / no overlap / overlap", "comm / compute",
                     "kB/rank counted", "model ms (error)", "load before / after"], rows),
            "", "Per round: tries (a disturbed round is re-run), the 1-min load, other processes' "
            "cores, the host probe (ms of a fixed one-thread workload: higher is a slower host), "
            "a dense method's forward / backward in its floor launch, the round's duration.", "",
            *_table(["round", "status", "tries", "load before / after", "other cores",
                     "host probe ms", "forward / backward ms", "round s"], rounds),
            *([f"\nNot run: {', '.join(sweep.not_run)}."] if sweep.not_run else [])]  # fmt: skip


def overhead_section(o: dict[str, Any] | None, proj: dict[str, Any] | None,
                     parts: dict[str, Any] | None) -> list[str]:  # fmt: skip
    lines = ["_overhead.json missing or of an older step: `make bench-overhead` on a quiet machine._"]  # fmt: skip
    if o is not None and o.get("scape_step") == SCAPE_STEP:
        rows = []
        for d in o["devices"].values():
            for label in ("scape-90", "scape-99"):
                m = d[label]
                part = {side: ", ".join(f"{k.split('.')[1]} {v * 1e3:.0f}" for k, v in m["median_s"].items()
                                        if k.startswith(side)) for side in ("scape.", "dense.")}  # fmt: skip
                rows.append([d["name"], label, f"{m['scape_total_s'] * 1e3:.0f} ({part['scape.']})",
                             f"{m['dense_total_s'] * 1e3:.0f} ({part['dense.']})",
                             f"{m['scape_over_dense_total']:.2f}", f"{m['per_step_s']['llama-1.8b']['scape']:.2f}",
                             _load_cell(m.get("quiet") or {})])  # fmt: skip
        lines = [f"One Megatron bucket as a rank sees it (W={o['world_size']}, bucket {o['bucket']:,}, "
                 f"shard {o['shard']:,}), medians, SCAPE and dense parts alternating; per step = per "
                 f"bucket x buckets ({o['buckets_per_model']}).",
                 *([f"\n**GPU: skipped by this benchmark** ({o['gpu_skipped']})."] if "gpu_skipped" in o else []), "",
                 *_table(["device", "method", "SCAPE ms/bucket (parts)", "dense ms/bucket (parts)",
                          "SCAPE / dense", "SCAPE s/step Llama-1.8B", "load before / after"], rows)]  # fmt: skip
    if proj is not None:
        m18, s = proj["models"]["llama-1.8b"], proj["models"]["llama-1.8b"]["scape"]
        lines += ["", f"GPU, {proj['optimizer_source']}: SCAPE-99 {s['scape-99']['optimizer_s'] * 1e3:.1f} ms, "
                  f"SCAPE-90 {s['scape-90']['optimizer_s'] * 1e3:.1f} ms per Llama-1.8B step (dense AdamS "
                  f"{m18['dense_optimizer_s'] * 1e3:.1f} ms), against {m18['compute_s'] * 1e3:.0f} ms of "
                  f"dense compute (FLOPs at MFU {proj['assumptions']['mfu']:.1%}; {m18['tokens_per_gpu']:,} tokens/GPU)."]  # fmt: skip
    if parts is not None:
        rows = []
        for name, e in parts["methods"].items():
            rest = e["step_s"] - e["forward_s"] - e["backward_s"] - sum(e["parts_s"].values())
            cells = [*(e[k] for k in ("step_s", "forward_s", "backward_s")),
                     *(e["parts_s"][k] for k in PARTS), rest]  # fmt: skip
            rows.append([name, *(f"{c * 1e3:.0f}" for c in cells)])
        lines += ["", f"Where section 2's compute-only step goes (`make bench-floor-parts`, started "
                  f"{parts['started_at']}, {parts['world_size']} ranks, {parts['steps']} steps under "
                  f"`torch.profiler` after {parts['warmup']}; load {_load_cell(parts.get('quiet') or {})}), "
                  "ms per step; the rest is dense's optimizer step and Megatron's bookkeeping. The "
                  "profiler slows every op: read the parts as proportions.", "",
                  *_table(["method", "step ms (profiled)", "forward", "backward", *PARTS, "rest"], rows)]  # fmt: skip
    return lines


def projection_section(p: dict[str, Any] | None, bench_dir: Path) -> list[str]:
    if p is None:
        return ["_projection.json missing: run `make bench-project`._"]
    a, cal = p["assumptions"], p["gpu_calibration"]
    if isinstance(cal, dict):
        cal = f"MFU {cal['mfu']:.1%} and kernels from {cal['file']} ({cal['gpu']})"
    rows = [[model, label, _ms(m["compute_s"]), _ms(m["dense_step_s"]["no_overlap"]),
             _ms(s["step_s"]["no_overlap"]), f"{s['speedup_no_overlap']:.2f}",
             f"{s['saving_no_overlap']:.1%}", f"{s['speedup_full_overlap']:.2f}"]
            for model, m in p["models"].items() for label, s in m["scape"].items()]  # fmt: skip
    sweep = p["speedup_vs_tokens_per_gpu_no_overlap"]["llama-1.8b"]
    lines = [f"{a['world_size']} GH200 nodes, one GPU each; {a['link_gbit']:.0f} Gbit/s x "
             f"{a['link_efficiency']} per rank, alpha {a['alpha_us']:.0f} us per ring step; compute = "
             f"FLOPs / ({a['peak_tflops']:.0f} TFLOP/s x MFU {a['mfu']:.3g}); {a['tokens_per_gpu']:,} "
             f"tokens/GPU/step; optimizer work {p['optimizer_source']}; GPU calibration: {cal}. "
             "`no overlap`: every exchange after backward; `overlap`: both methods hide their value "
             "exchange behind compute.", "",
             *_table(["model", "method", "compute ms", "dense ms", "SCAPE ms", "speed-up",
                      "time saved", "speed-up (overlap)"], rows), "",
             "Llama-1.8B SCAPE-99 speed-up (no overlap) against tokens per GPU per step: "
             + ", ".join(f"{int(t):,}: x{v['scape-99']:.2f}" for t, v in sweep.items())
             + f". Paper: x{p['paper']['speedup_llama_1_8b']} (Llama-1.8B), "
             f"{p['paper']['wallclock_saving_llama_500m']:.1%} less wall-clock (Llama-500M).", ""]  # fmt: skip
    if (summary := _load(bench_dir / "break_even.json")) is None:
        return [*lines, "_Not rendered yet: `make bench-break-even` writes break_even.{png,md,csv,json}._"]  # fmt: skip
    return lines + ["![break-even map](break_even.png)", "",
                    f"`make bench-break-even`: the projection for {summary['model']} on "
                    f"{summary['world_size']} ranks over per-rank link bandwidth x tokens per GPU per "
                    f"step. Red: SCAPE-99 at the paper's x{summary['target']}; dashed orange: SCAPE-90. A "
                    "measured round's comm / compute (section 2) against the ratio the paper's speed-up "
                    "needs (below) says where it stands. Where the speed-up still reaches the paper's, by batch: [`break_even.md`](break_even.md); "
                    "every cell: `break_even.csv`.", "", in_words(summary)]  # fmt: skip


def targets(b: dict[str, Any] | None, points: list[Point], proj: dict[str, Any] | None, wire: str) -> list[list[str]]:  # fmt: skip
    rows = []
    if b is not None:
        scale = b["paper_scale"][list(b["paper_scale"])[-1]]
        agree = all(e.get("matches_formula", True) for e in b["measured"]["methods"].values())
        for label in ("99", "90"):
            goal = TARGETS[f"bytes{label}"]
            ratio = {w: scale["methods"][f"scape-{label}{s}"]["dense_over_this"] for w, s in (("bfloat16", "-bf16"), ("float32", ""))}  # fmt: skip
            other = next(w for w in ratio if w != wire)
            ok = "met" if ratio[wire] >= goal else f"met with {WIRE[other]} values" if ratio[other] >= goal else "not met"  # fmt: skip
            shipped = scale["methods"].get(f"scape-{label}-shipped-run")
            run = ("" if shipped is None else f"; over a run the shipped config's density ramp "
                   f"makes it 1/{shipped['dense_over_this']:.1f}")  # fmt: skip
            rows.append([f"bytes at {label}% sparsity <= 1/{goal:g} of dense ZeRO-1 bf16",
                         ", ".join(f"1/{ratio[w]:.1f} with {WIRE[w]} values" + (" (the configs')" if w == wire else "") for w in (wire, other)) + ", "
                         f"W={scale['world_size']}, the steady step; counters {'match' if agree else '**do not match**'} "
                         f"the formula{run}", ok if not run else f"{ok} (steady step)"])  # fmt: skip
    at = {(p.world_size, p.link, p.method): p for p in points}
    for w, method, key in ((2, "scape-99", "scape99_w2"), (4, "scape-99", "scape99_w4"),
                           (2, "scape-90", "scape90_w2")):  # fmt: skip
        p, goal = at.get((w, "1gbit", method)), TARGETS[key]
        text = f"{w} ranks, 1 Gbit/s: {method.upper()} >= x{goal:g} faster than dense AdamS"
        rows.append([text, NOT_RUN, "-"] if p is None or p.speedup_vs_best_dense is None else
                    [text, f"{_x(p.speedup_vs_best_dense)} against the faster dense; load {_load_cell(p)}",
                     ("met" if p.speedup_vs_best_dense >= goal else "not met") + (" (noisy)" if p.noisy else "")])  # fmt: skip
    p, goal = at.get((2, "1gbit", "scape-99")), TARGETS["scape99_w2_over_floor"]
    text = f"2 ranks, 1 Gbit/s: SCAPE-99 step <= {goal:g}x its compute-only floor"
    rows.append([text, NOT_RUN, "-"] if p is None or p.step_over_floor is None else
                [text, f"{p.step_over_floor:.2f}x ({_ms(p.step_s)} ms / {_ms(p.floor_s)} ms)",
                 "met" if p.step_over_floor <= goal else "not met"])  # fmt: skip
    errs = sorted(((abs(p.model_error), p) for p in points if p.model_error is not None), key=lambda e: e[0])  # fmt: skip
    text = f"cost model within {TARGETS['model_error']:.0%} of every measured point (median)"
    rows.append([text, NOT_RUN, "-"] if not errs else
                [text, f"{sum(e <= TARGETS['model_error'] for e, _ in errs)}/{len(errs)} within; worst "
                 f"{errs[-1][0]:.0%} ({errs[-1][1].world_size} x {errs[-1][1].link} {errs[-1][1].method})",
                 "met" if errs[-1][0] <= TARGETS["model_error"] else "not met"])  # fmt: skip
    if proj is not None:
        m18, cal = proj["models"]["llama-1.8b"], proj.get("gpu_calibration")
        share = [m18["scape"][k]["optimizer_s"] / m18["compute_s"] for k in ("scape-99", "scape-90")]  # fmt: skip
        text = f"{share[0]:.1%} (99%), {share[1]:.1%} (90%)"
        rows.append([f"SCAPE optimizer work <= {TARGETS['overhead_gpu']:.0%} of dense compute, Llama-1.8B, GPU", *(
            [f"not measured (no GPU); modeled {text}", "unverified"] if not isinstance(cal, dict) else
            [f"{text}: kernels measured on {cal['gpu']} (one rank of W=32), compute at its MFU {cal['mfu']:.1%}",
             "met" if max(share) <= TARGETS["overhead_gpu"] else "not met"])])  # fmt: skip
    return rows


def notes(sweep: Sweep | None, o: dict[str, Any] | None, proj: dict[str, Any] | None) -> list[str]:
    """Findings and caveats; every figure in them read from the files."""
    q = (sweep.protocol if sweep and sweep.protocol else None) or (o or {}).get("protocol")
    limits = (f" (load above {q['max_load']} before it, or others above {q['max_other_cores']} cores; "
              f"at most {q['retries']} re-runs)") if q else ""  # fmt: skip
    out = [f"- Quiet-machine protocol (`benchmarks/harness/quiet.py`): a timing benchmark refuses to "
           "start beside a study, the tests or another benchmark; it records the 1-min load, other "
           "processes' CPU and a host probe around each round, and re-runs a disturbed round"
           f"{limits}, then keeps it marked **noisy**. The load after a round includes its own ranks.",
           "- Ranks beyond the cores time-slice their compute (the floor "
           "includes that): such speed-ups are not a scaling result.",
           "- SCAPE's step is bound by its own CPU work on this host and dense AdamS's by the link, "
           "so SCAPE's ratios follow the host's speed (the host probe per round); the comm / compute "
           "column compares a round with the ratio the break-even map says the paper's speed-up needs.",
           "- SCAPE has no parameter all-gather: every rank decodes the summed buffer and updates all "
           "N entries, O(N) per rank against dense ZeRO-1's O(N/W); section 3 times it (GPU: `scripts/gpu_check.py`)."]  # fmt: skip
    if proj is not None:
        m18, a = proj["models"]["llama-1.8b"], proj["assumptions"]
        out.append(f"- The projection assumes one value all-reduce per Megatron bucket ({m18['buckets']} "
                   f"for Llama-1.8B at {a['world_size']} ranks) and one mask all-gather per step; at "
                   f"{a['alpha_us']:g} us per ring step the small all-reduces are latency-bound, which "
                   "`fuse_buckets=true` (one all-reduce per step, after backward) trades against overlap.")  # fmt: skip
    return out


def gpu_section() -> list[str]:
    """Issue 40's goals and the memory per rank, from the newest GPU check of the fused step."""
    from benchmarks.gpu_goals import goal_rows, memory_rows, newest_check
    from scape.megatron.models import SHAPES, count_params

    found = newest_check()
    n = count_params(SHAPES["llama-1.8b"])
    if found is None:
        return ["_No GPU check of the fused step in results/gpu/ yet (`scripts/gpu_check.sh`)._"]
    path, report = found
    env = report["environment"]
    commit = env.get("git_commit_stated") or f"{env['git_commit'][:10]} as the machine saw it"
    return [f"From `{path}` ({env['gpu']}, torch {env['torch']}, Triton {env.get('triton')}, "
            f"1-min load {env.get('load_average_1min', float('nan')):.2f}, commit {commit}; "
            "see results/gpu/README.md for the code it ran).", "",
            *_table(["goal", "bound", "measured", "status"], goal_rows(report)), "",
            "Memory per rank (bf16 model params, fp32 grads):", "",
            *_table(*memory_rows(report, n))]  # fmt: skip


def cpu_ab_section(bench_dir: Path) -> list[str]:
    """The newest CPU A/B of the SCAPE step (`benchmarks.ab_step`'s lines, saved as
    ``ab_step_<A>_vs_<B>.jsonl``): issue 40's "no regression" on CPU."""
    files = sorted(bench_dir.glob("ab_step_*_vs_*.jsonl"), key=lambda f: f.stat().st_mtime)
    if not files:
        return ["_No CPU A/B of the step yet (`python -m benchmarks.ab_step A B > "
                "results/bench/ab_step_<A>_vs_<B>.jsonl`)._"]  # fmt: skip
    path = files[-1]
    names = path.stem.removeprefix("ab_step_").split("_vs_")
    rows = [json.loads(line) for line in path.read_text().splitlines() if '"round"' in line]
    order = list(dict.fromkeys(r["tree"] for r in rows))  # round 0 times A first
    medians = [statistics.median(r["median_step_s"] for r in rows if r["tree"] == t) for t in order]
    loads = [r["load_before"] for r in rows]
    return [f"CPU, the SCAPE-99 adapter step side by side (`python -m benchmarks.ab_step`, "
            f"{len({r['round'] for r in rows})} rounds, [`{path.name}`]({path.name})): median "
            f"step {medians[0]:.4f} s at {names[0]}, {medians[1]:.4f} s at {names[1]}; 1-min "
            f"load before the rounds {min(loads):.2f}-{max(loads):.2f} (after the first, the "
            "benchmark's own ranks)."]  # fmt: skip


def shipped_wire() -> str:
    """The values' dtype the SCAPE configs send (the quality study's recipe decides it)."""
    from pipelines.training.config import compose

    return compose(["optimizer=scape99"]).optimizer.scape.value_dtype


def render(bench_dir: Path, wire: str | None = None) -> str:
    wire = wire or shipped_wire()
    b, o, p, parts = (_load(bench_dir / f"{n}.json") for n in ("bytes", "overhead", "projection", "floor_parts"))  # fmt: skip
    s = _load(bench_dir / "megatron_step.json")
    sweep = None if s is None else from_json(Sweep, s)
    return "\n".join([
        "# Performance benchmarks (issues 6, 14)", "",
        "Rendered by `make bench-report` (the last step of `make bench`) from the JSON files beside "
        "it. Every timing carries the 1-min load before and after its round (see the notes).", "",
        "## Targets", "", *_table(["target", "where we stand", "status"], targets(b, sweep.points if sweep else [], p, wire)),
        "", "## 1. Bytes per rank per step", "", *bytes_section(b, wire), "",
        "## 2. The Megatron train step on an emulated cluster", "", *step_section(sweep), "",
        "## 3. Optimizer-side work", "", *overhead_section(o, p, parts), "",
        "## 4. Projection to the paper's cluster, and where SCAPE pays", "", *projection_section(p, bench_dir), "",
        "## 5. SCAPE's step on a GPU and its memory (issue 40)", "", *gpu_section(), "",
        *cpu_ab_section(bench_dir), "",
        "## 6. Peers: PowerSGD, DGC-style top-k, 1-bit-Adam-style (issue 8)", "",
        "`make peers-study` (losses, bytes) and `make bench-peers-cluster` (step times on the emulated "
        "cluster): [results/peers/README.md](../peers/README.md).", "",
        "## Findings and caveats", "", *notes(sweep, o, p), ""])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, timing=False)
    parser.add_argument("--bench-dir", type=Path, default=Path("results/bench"))
    out = parser.parse_args(argv).bench_dir / "README.md"
    out.write_text(render(out.parent))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
