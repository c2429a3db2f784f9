#!/usr/bin/env bash
# GPU readiness check for SCAPE on megatron-core: one prepared run, no network, < 8 minutes.
#
#   scripts/gpu_check.sh                       # uses .venv/bin/python if present, else python3
#   WHEELHOUSE=/path/to/wheels scripts/gpu_check.sh   # first installs missing wheels offline
#
# What it does (details in scripts/gpu_check.py): a few dense-AdamS and SCAPE steps of GPT-345M
# on one GPU (W=1, NCCL, bf16), and a micro-benchmark of mask selection, packing and scattering
# at Llama-1.8B shard sizes for W=32. Writes results/gpu/gpu_check_<gpu>_<date>.json (GPU name,
# versions, date). Without a CUDA device it prints SKIPPED and writes nothing.
#
# Bringing wheels to a machine without network: on a machine with network and the SAME Python
# version and CPU architecture (TACC Vista is aarch64), download them, copy the directory over:
#   pip download -d wheels --only-binary=:all: --python-version 3.11 \
#       --platform manylinux2014_aarch64 torch megatron-core==0.16.1 numpy packaging
#   (x86_64: --platform manylinux2014_x86_64; torch's CUDA wheels come from its own index:
#    add --index-url https://download.pytorch.org/whl/cu126 for torch)
# then run with WHEELHOUSE=wheels. Only the packages that fail to import are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [[ -n "${WHEELHOUSE:-}" ]]; then
  missing=()
  "$PY" -c "import torch" 2>/dev/null || missing+=(torch)
  "$PY" -c "import megatron.core" 2>/dev/null || missing+=(megatron-core)
  "$PY" -c "import numpy" 2>/dev/null || missing+=(numpy)
  if ((${#missing[@]})); then
    echo ">> installing ${missing[*]} from $WHEELHOUSE (offline)"
    "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" "${missing[@]}"
  fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"  # model init runs on the CPU
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" scripts/gpu_check.py "$@"
