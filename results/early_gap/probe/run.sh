#!/usr/bin/env bash
# The dense-parameter probe (results/early_gap/README.md, "Where the sparse step loses"):
# SCAPE-90 at x4 dense AdamS's lr, 400 or 3,000 steps, seeds 0-2, with some parameters moved
# into a bucket of their own that is sent whole every step (DIAG_DENSE) or at k of 100
# (DIAG_K), paired with the study's runs by compare.py. A probe, not a
# library option: dense_params.patch applies it to a scratch worktree of this commit, so the
# library, its code version and the study's runs stay as they are.
# Usage (from the repository root, after make corpus-large): bash results/early_gap/probe/run.sh
# (PROBES="name ...": only those; a probe whose runs are stored is not rerun)
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
# name, model, steps, lr scale (x4 dense AdamS's choice at that horizon), params sent apart
# (names containing: 1d = every 1-D param, pos, emb, out), their k of 100 (0: whole)
while read -r name model steps lr dense k; do
  if [ -n "${PROBES:-}" ] && [[ " $PROBES " != *" $name "* ]]; then continue; fi
  if compgen -G "$out/$name/runs/*.tar.xz" > /dev/null; then continue; fi  # stored already
  echo "probe $name: $model, $dense at k=$k (0: whole)"
  (cd "$work/tree" && DIAG_DENSE=$dense DIAG_K=$k OMP_NUM_THREADS=1 "$repo/.venv/bin/python" \
    -m pipelines.quality_study data_dir=data/debian_docs_large__bytebpe1k "out_dir=$out/$name" \
    report=false final_test=true "scale.steps=$steps" "only_models=[$model]" \
    "only_variants=[scape90]" "seeds=[0,1,2]" "ablation_seeds=[0,1,2]" "lr_scales=[$lr]" \
    close_grids=0 > "$out/$name.log" 2>&1)
  grep -m1 "^DIAG dense" "$out/$name.log" > "$out/$name.dense.txt" || true
  grep -m1 "^DIAG k" "$out/$name.log" >> "$out/$name.dense.txt" || true
  "$repo/.venv/bin/python" -m pipelines.studies.run_store "$out/$name/runs"
  rm "$out/$name.log"
done <<'PROBES'
gpt_1d gpt 400 4 1d 0
gpt_pos gpt 400 4 pos 0
gpt_emb gpt 400 4 emb 0
gpt_emb_k20 gpt 400 4 emb 20
llama_emb llama 400 1 emb 0
llama_embout llama 400 1 emb,out 0
gpt_emb_t3000 gpt 3000 4 emb 0
llama_emb_t3000 llama 3000 1 emb 0
PROBES
"$repo/.venv/bin/python" results/early_gap/probe/compare.py "$out"
