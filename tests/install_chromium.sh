#!/bin/sh
# Installs Debian's chromium for the browser tests (tests/test_browser_*.py), which drive the
# system's Chromium with Playwright and download nothing. It acts only where apt-get exists, the
# user is root and no Chromium is on the machine; elsewhere it does nothing, and the browser
# tests skip with the reason. The README's test command (and so CI) runs it before pytest; a
# failing apt-get fails that command.
set -eu
if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1 \
        || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "install_chromium.sh: no Chromium, and no apt-get as root to install it: the browser tests will be skipped" >&2
    exit 0
fi
echo "install_chromium.sh: installing Debian's chromium with apt-get for the browser tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
if ! command -v chromium >/dev/null 2>&1; then
    echo "install_chromium.sh: apt-get installed chromium, yet no chromium command is on PATH" >&2
    exit 1
fi
