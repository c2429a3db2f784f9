#!/usr/bin/env bash
# A larger quality check on one CUDA GPU: dense AdamS, SCAPE-90 and SCAPE-99 (the library's
# step) through the quality study's simulator, a ~52M-parameter Llama on the embedded corpus,
# 1,000 steps each (conf/quality/scale/gpu.yaml), all three within 8 minutes on one H200.
#
#   scripts/gpu_quality.sh                              # .venv/bin/python if present, else python3
#   WHEELHOUSE=/path/to/wheels scripts/gpu_quality.sh   # first installs missing wheels offline
#
# It needs the prepared corpus data/enwiki_sample__bytebpe1k (make quality-study prepares it;
# carry the folder, 2.5 MB, to a machine without network). Writes
# results/gpu/gpu_quality_<gpu>_<date>.json (final losses, curves, seconds per run, versions).
# Without a CUDA device it prints SKIPPED and writes nothing. Wheels: as for gpu_check.sh, plus
# hydra-core and omegaconf (pip download ... megatron-core hydra-core omegaconf numpy packaging).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [[ -n "${WHEELHOUSE:-}" ]]; then
  missing=()
  for mod in torch:torch megatron.core:megatron-core hydra:hydra-core omegaconf:omegaconf numpy:numpy; do
    "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
  done
  if ((${#missing[@]})); then
    echo ">> installing ${missing[*]} from $WHEELHOUSE (offline)"
    "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" "${missing[@]}"
  fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 540 "$PY" scripts/gpu_quality.py "$@"
