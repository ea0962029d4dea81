#!/usr/bin/env bash
# Run every probe (ceilings, linear, batch_scaling) on this machine's GPU in under five
# minutes and print a short table. Needs the probes extra: pip install -e '.[probes]'.
#   benchmarks/gpu_check.sh                 # CUDA (fails clearly without it)
#   benchmarks/gpu_check.sh --device cpu    # the CPU, on purpose
#   benchmarks/gpu_check.sh --model /models/Llama-3.2-1B
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec timeout 300 "$PY" benchmarks/gpu_check.py "$@"
