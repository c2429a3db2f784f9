#!/usr/bin/env bash
# GPU check for SCAPE on megatron-core: one prepared run, no network, within 6 minutes.
#
#   scripts/gpu_check.sh                       # uses .venv/bin/python if present, else python3
#   PYTHON=python3.12 scripts/gpu_check.sh
#
# Versions it expects: the two the adapter is tested on. megatron-core 0.19.2 (what
# environment.yml installs on clusters; make test-mcore-latest) on Python 3.12 with a CUDA
# build of torch, or 0.16.1 (requirements/cpu.txt, make test) where the machine has 3.11.
# Where megatron-core is not installed, it is installed offline from vendor/wheels/: run
# `make gpu-wheels` (ARCH=aarch64 for TACC Vista) on a machine with network beforehand; pip
# checks the wheel against the sha256 pinned in requirements/mcore-latest.txt. torch, numpy
# and packaging must already be there (WHEELHOUSE=/path installs them from a wheel directory).
#
# What it does (details in scripts/gpu_check.py and scripts/gpu_adapter_check.py): the
# memory floor (one fp32 copy pass over Llama-1.8B's entries); one rank's SCAPE step at
# Llama-1.8B for W=32 through scape.step (pack, finish, select, the whole step) against that
# floor, beside the dense baselines' shard updates; the adapter on one GPU (W=1, NCCL, bf16,
# Llama-1.8B): dense AdamS, dense AdamW and SCAPE-99 by phase with peak memory, and SCAPE
# against the simulator; GPT-345M whole steps of the four methods (SDPA attention). Writes
# results/gpu/gpu_check_<gpu>_<date>.json (GPU, versions, commit, load average) part by part.
# Without a CUDA device it prints one SKIPPED line and writes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  exec "$PY" scripts/gpu_check.py "$@"  # says SKIPPED (or that torch is missing) in one line
fi
if [[ -n "${WHEELHOUSE:-}" ]]; then
  missing=()
  "$PY" -c "import numpy" 2>/dev/null || missing+=(numpy)
  "$PY" -c "import packaging" 2>/dev/null || missing+=(packaging)
  if ((${#missing[@]})); then
    echo ">> installing ${missing[*]} from $WHEELHOUSE (offline)"
    "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" "${missing[@]}"
  fi
fi
if ! "$PY" -c "import megatron.core" 2>/dev/null; then
  if ! compgen -G "vendor/wheels/megatron_core-*.whl" >/dev/null; then
    echo "gpu_check: megatron-core is not installed and vendor/wheels/ has no wheel of it:" \
      "run 'make gpu-wheels' on a machine with network first" >&2
    exit 1
  fi
  echo ">> installing megatron-core from vendor/wheels/ (offline, sha256 from requirements/mcore-latest.txt)"
  "$PY" -m pip install --no-index --no-deps --find-links vendor/wheels -r requirements/mcore-latest.txt
fi
"$PY" - <<'EOF'
import sys, torch
from scape.megatron.versions import TESTED_VERSIONS, megatron_core_version
found = megatron_core_version()
note = "tested" if found in TESTED_VERSIONS else f"NOT one of the tested {', '.join(TESTED_VERSIONS)}"
print(f">> Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"megatron-core {found} ({note})")
EOF
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"  # model init runs on the CPU
exec timeout 390 "$PY" scripts/gpu_check.py "$@"  # its parts stop starting at 330 s
