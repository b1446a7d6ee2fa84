#!/usr/bin/env bash
# The GGUF export's checks against llama.cpp itself, in a second venv with llama-cpp-python built from source.
#
#   bash scripts/test_llama_cpp.sh [VENV]      # default VENV: ~/.cache/tinyrl/venv-llama-<version>
#
# Run it from the main test venv (the README's test command activates .venv first): VENV is a venv
# of the same Python that sees the main venv's packages (torch, transformers, tinyrl, gguf, through a
# .pth file) and adds only llama-cpp-python, built from its PyPI source distribution (no CPU wheel is
# published) with cmake and the C/C++ compiler. The source distribution is kept in VENV/src: it holds
# llama.cpp's own vendor/llama.cpp/convert_hf_to_gguf.py, which the tests run as the reference converter.
# The venv lives in the user's cache, outside the clone, so a fresh clone (CI) reuses the build: a stamp
# records the version; when it matches and the imports work the build is skipped (seconds), and only the
# .pth that points at the current main venv is rewritten. The first build took about 30 min here (2 cores
# shared with other work).
#
# Then it runs tests/test_gguf_llama_cpp.py in VENV: llama.cpp's greedy output on tinyrl's GGUF
# exports equals the merged model's (the tiny model, SmolLM2-135M), and the exported tensors equal
# those of convert_hf_to_gguf.py on the same merged folder.
#
# If VENV cannot be built (no compiler or cmake, no network to PyPI, no disk), the script says so,
# says that the llama.cpp tests did NOT run, and exits 0: a machine that cannot build llama.cpp is
# not a failure of tinyrl. Once VENV is built, any failing test fails the script.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="0.3.36"                          # llama-cpp-python; its llama.cpp writes and reads what gguf 0.19 does
EXTRAS=(sentencepiece)                   # convert_hf_to_gguf.py imports it (the llama family's vocab path)
VENV="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tinyrl/venv-llama-$VERSION}"
PYTHON="${PYTHON:-python}"                # the main test venv's python (tinyrl, torch, transformers, gguf)
PY="$VENV/bin/python"
SRC="$VENV/src/llama_cpp_python-$VERSION"
CONVERTER="$SRC/vendor/llama.cpp/convert_hf_to_gguf.py"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

build() {
    set -e
    command -v "$PYTHON" >/dev/null || { echo "no '$PYTHON' on PATH (activate the main test venv)"; return 1; }
    "$PYTHON" -c "import tinyrl, torch, transformers, gguf, pytest" \
        || { echo "'$PYTHON' lacks tinyrl's test stack (activate the main venv: pip install -e '.[dev]')"; return 1; }
    local main_site stamp want
    main_site="$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
    stamp="$VENV/.tinyrl-llama-env"
    want="llama-cpp-python==$VERSION ${EXTRAS[*]}"
    link_main() {  # the main venv's packages, seen through its site dir (processed like site-packages, its .pth files too)
        local site
        site="$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
        echo "import site; site.addsitedir('$main_site')" > "$site/_tinyrl_main_venv.pth"
    }
    works() {
        [[ -f "$CONVERTER" ]] && "$PY" -c "import llama_cpp, sentencepiece, tinyrl, torch, transformers, gguf, pytest" >/dev/null 2>&1
    }
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && link_main && works; then
        echo "llama.cpp test venv up to date: $VENV"
        return 0
    fi
    for tool in cmake gcc g++; do
        command -v "$tool" >/dev/null || { echo "no $tool on PATH: llama.cpp cannot be built here"; return 1; }
    done
    local start=$SECONDS
    [[ -x "$PY" ]] || { mkdir -p "$(dirname "$VENV")" && "$PYTHON" -m venv "$VENV"; }
    link_main
    local pip=("$PY" -m pip --disable-pip-version-check)
    if [[ ! -f "$SRC/pyproject.toml" ]]; then
        mkdir -p "$VENV/src"
        "${pip[@]}" download -q --no-deps --no-binary :all: -d "$VENV/src" "llama-cpp-python==$VERSION"
        tar xzf "$VENV/src/llama_cpp_python-$VERSION.tar.gz" -C "$VENV/src"
    fi
    # the CPU library only (no llava / mtmd); the compiler's -march=native is fine for a local cached venv
    if [[ "$("$PY" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null)" != "$VERSION" ]]; then
        CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
            "${pip[@]}" install -q "$SRC"
    fi
    "${pip[@]}" install -q "${EXTRAS[@]}"
    if ! works; then
        echo "llama.cpp test venv built at $VENV, but an import fails:"
        "$PY" -c "import llama_cpp, sentencepiece, tinyrl, torch, transformers, gguf, pytest" || true
        return 1
    fi
    echo "$want" > "$stamp"
    echo "llama.cpp test venv ready at $VENV in $((SECONDS - start)) s ($("$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"))"
}

(build) >"$log" 2>&1  # (not under `if`: that would switch off the set -e inside)
if [[ $? -ne 0 ]]; then
    tail -20 "$log" >&2
    echo "test_llama_cpp.sh: could not build the llama.cpp venv at $VENV (above): the llama.cpp GGUF tests did NOT run" >&2
    exit 0
fi
tail -1 "$log"
cd "$REPO" && TINYRL_LLAMA_CPP_CONVERTER="$CONVERTER" "$PY" -m pytest -q -m "slow or not slow" tests/test_gguf_llama_cpp.py
