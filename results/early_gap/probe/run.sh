#!/usr/bin/env bash
# The dense-parameter probe (results/early_gap/README.md, "Where the GPT's gap lives"): SCAPE-90
# at x4 dense AdamS's lr, 400 steps, seeds 0-2, with some parameters moved into a bucket of
# their own that is sent whole every step (DIAG_DENSE) or at k of 100 (DIAG_K). A probe, not a
# library option: dense_params.patch applies it to a scratch worktree of this commit, so the
# library, its code version and the study's runs stay as they are.
# Usage (from the repository root, after make corpus-large): bash results/early_gap/probe/run.sh
set -euo pipefail
repo=$(pwd)
work=${PROBE_WORK:-$(mktemp -d)}
out=${PROBE_OUT:-results/early_gap/probe/runs}
mkdir -p "$out"; out=$(cd "$out" && pwd)
if [ ! -d "$work/tree" ]; then
  git worktree add -q --detach "$work/tree" HEAD
  git -C "$work/tree" apply "$repo/results/early_gap/probe/dense_params.patch"
  ln -s "$repo/data" "$work/tree/data"
fi
# name, model, lr scale (x4 dense AdamS's choice at 400 steps), params sent apart, their k
while read -r name model lr dense k; do
  echo "probe $name: $model, $dense at k=$k (0: whole)"
  (cd "$work/tree" && DIAG_DENSE=$dense DIAG_K=$k OMP_NUM_THREADS=1 "$repo/.venv/bin/python" \
    -m pipelines.quality_study data_dir=data/debian_docs_large__bytebpe1k "out_dir=$out/$name" \
    report=false final_test=true scale.steps=400 "only_models=[$model]" \
    "only_variants=[scape90]" "seeds=[0,1,2]" "ablation_seeds=[0,1,2]" "lr_scales=[$lr]" \
    close_grids=0 > "$out/$name.log" 2>&1)
  grep -m1 "^DIAG dense" "$out/$name.log" > "$out/$name.dense.txt" || true
  grep -m1 "^DIAG k" "$out/$name.log" >> "$out/$name.dense.txt" || true
  "$repo/.venv/bin/python" -m pipelines.studies.run_store "$out/$name/runs"
  rm "$out/$name.log"
done <<'PROBES'
gpt_1d gpt 4 1d 0
gpt_pos gpt 4 pos 0
gpt_emb gpt 4 emb 0
gpt_emb_k20 gpt 4 emb 20
llama_emb llama 1 emb 0
llama_embout llama 1 emb,out 0
PROBES
"$repo/.venv/bin/python" results/early_gap/probe/compare.py "$out"
