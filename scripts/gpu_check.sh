#!/usr/bin/env bash
# tinyrl's one-shot GPU check: run it on a bare CUDA machine with no network, where only this
# repository has arrived (tinyrl need not be installed; torch, triton, transformers, peft and
# accelerate must be). It runs the CUDA tests, the Triton fused loss against its torch reference
# at real vocabulary sizes, GRPO steps on real model shapes, and the memory planner against
# torch.cuda.max_memory_allocated, in <= 8 minutes; it writes one JSON report and prints a table.
# Anything it cannot run (vLLM, bitsandbytes) is listed as skipped.
#
#   bash scripts/gpu_check.sh                     # report: gpu_check.json
#   bash scripts/gpu_check.sh --out /tmp/r.json --budget-s 420
#   bash scripts/gpu_check.sh --cpu               # dry run on a CPU (tiny sizes; CI runs this)
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
