#!/usr/bin/env bash
# The GGUF export's checks against llama.cpp itself: tests/test_gguf_llama_cpp.py, in the main test venv.
#
#   bash scripts/test_llama_cpp.sh      # from the main venv (the README's test command activates .venv)
#
# llama.cpp comes with the dev extra: xllamacpp, a prebuilt CPU wheel of llama.cpp's server engine (nothing
# is compiled). The tests also run llama.cpp's own converter, convert_hf_to_gguf.py, which no wheel ships:
# the script downloads llama-cpp-python's source distribution once (77 MB; nothing in it is built), keeps
# only the converter's files, in ~/.cache/tinyrl/llama-cpp-python-<version>/, and names it in
# TINYRL_LLAMA_CPP_CONVERTER. Without that variable the test file skips whole, so its tests run here only.
#
# A missing import (xllamacpp, sentencepiece, gguf, tinyrl) fails the script: the dev extra has them. A
# failed download (no network) skips the converter comparisons, and says so; the rest still runs.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="0.3.36"     # llama-cpp-python; its vendored converter writes what gguf 0.19 does
PYTHON="${PYTHON:-python}"
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/tinyrl/llama-cpp-python-$VERSION"
CONVERTER="$DIR/llama.cpp/convert_hf_to_gguf.py"

if ! "$PYTHON" -c "import xllamacpp, sentencepiece, gguf, tinyrl, pytest"; then
    echo "test_llama_cpp.sh: '$PYTHON' lacks the llama.cpp test stack (above); install it: pip install -e '.[dev]'" >&2
    echo "test_llama_cpp.sh: the llama.cpp GGUF tests did NOT run" >&2
    exit 1
fi

fetch() {  # the converter's files from the sdist: the script, its conversion package, gguf-py, chat templates
    local tmp src="llama_cpp_python-$VERSION/vendor/llama.cpp"
    mkdir -p "$(dirname "$DIR")" && tmp="$(mktemp -d "$DIR.tmp-XXXXXX")" || return 1
    if "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$VERSION" \
        && tar xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp" "$src/convert_hf_to_gguf.py" "$src/conversion" \
               "$src/gguf-py" "$src/models/templates" \
        && mkdir -p "$tmp/out" && mv "$tmp/$src" "$tmp/out/llama.cpp" && rm -rf "$DIR" && mv "$tmp/out" "$DIR"; then
        rm -rf "$tmp"
        return 0
    fi
    rm -rf "$tmp"
    return 1
}

if [[ ! -f "$CONVERTER" ]]; then
    echo "downloading llama.cpp's converter (llama-cpp-python==$VERSION's source distribution) into $DIR"
    if ! fetch; then
        echo "test_llama_cpp.sh: could not download llama-cpp-python==$VERSION (above; no network?):" \
             "the converter comparisons will be SKIPPED; llama.cpp's inference tests still run" >&2
        CONVERTER="unavailable (the download failed)"
    fi
fi

cd "$REPO" && TINYRL_LLAMA_CPP_CONVERTER="$CONVERTER" "$PYTHON" -m pytest -q -m "slow or not slow" -rs \
    tests/test_gguf_llama_cpp.py
