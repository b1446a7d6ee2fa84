#!/usr/bin/env bash
# Install the browser the UI's real-browser test drives: Debian's `chromium` package, used by
# Playwright through `executable_path` (never `playwright install`, which downloads its own build).
# Idempotent; exits 0 without doing anything when chromium is already on PATH. When it cannot
# install (no apt-get, no root, no network) it says why and exits 0: the browser test then skips
# and prints that reason.
set -u
if command -v chromium >/dev/null 2>&1; then
    echo "install_browser: $(command -v chromium) is already installed"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: no apt-get on this machine; install Chromium yourself to run tests/test_ui_browser.py"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser: not root and no password-less sudo; run: sudo apt-get install -y chromium"
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium >/tmp/install_browser.log 2>&1; then
    $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q >>/tmp/install_browser.log 2>&1
    $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium >>/tmp/install_browser.log 2>&1 \
        || { echo "install_browser: apt-get install chromium failed (see /tmp/install_browser.log)"; exit 0; }
fi
echo "install_browser: installed $(command -v chromium)"
