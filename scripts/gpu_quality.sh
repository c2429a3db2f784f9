#!/usr/bin/env bash
# The verdict at GPU scale, a few runs per lent GPU (issue 41): the next runs of the GPU queue
# (scripts/gpu_quality.py: the ~52M Llama and ~127M GPT of conf/quality/scale/gpu.yaml, dense
# AdamS/AdamW and SCAPE-90/99, a 3-point lr grid placed by the recipe, 2 seeds, 1,000 steps)
# that fit in --budget-s (default 480 s), each record written as soon as its run finishes.
#
#   scripts/gpu_quality.sh --dry-run                    # what this window would run
#   WHEELHOUSE=vendor/wheels scripts/gpu_quality.sh --out-dir $OUT/runs   # on a lent GPU
#
# It needs the prepared corpus data/debian_docs__bytebpe1k (make gpu-corpus; carry it and
# vendor with the tree). Commit what comes back under results/quality/gpu/runs/ (records) and
# results/gpu/ (the session's summary); make quality-report folds finished cells into the
# README and lists the pending ones. Without a CUDA device it prints SKIPPED and writes
# nothing. Wheels: as for gpu_check.sh, plus hydra-core and omegaconf.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [[ -n "${WHEELHOUSE:-}" ]]; then
  missing=()
  for mod in torch:torch megatron.core:megatron-core hydra:hydra-core omegaconf:omegaconf yaml:pyyaml antlr4:antlr4-python3-runtime numpy:numpy; do
    "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
  done
  if ((${#missing[@]})); then
    echo ">> installing ${missing[*]} from $WHEELHOUSE (offline)"
    "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" "${missing[@]}"
  fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 590 "$PY" scripts/gpu_quality.py "$@"
