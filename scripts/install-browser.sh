#!/bin/sh
# Install Debian's chromium for the browser tests (tests/viz/test_browser.py), only when it is
# missing. Idempotent and quiet; it never fails: without a browser those tests skip with a reason.
#
#   scripts/install-browser.sh        (make test runs it first)
#
# Needs root (or password-less sudo) and apt-get; otherwise it says why and does nothing.
set -u

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
say() { echo "install-browser: $*" >&2; }
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get on this system; the browser tests will skip"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        SUDO="sudo -n"
    else
        say "not root and no password-less sudo: cannot install chromium; the browser tests will skip"
        exit 0
    fi
fi
log=$(mktemp 2>/dev/null || echo /tmp/install-browser.$$.log)
export DEBIAN_FRONTEND=noninteractive
say "installing Debian's chromium (once) ..."
if $SUDO apt-get update -qq >"$log" 2>&1 &&
    $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=300 chromium >>"$log" 2>&1 &&
    command -v chromium >/dev/null 2>&1; then
    say "chromium installed: $(command -v chromium)"
else
    say "could not install chromium; the browser tests will skip. Last lines of apt-get:"
    tail -n 5 "$log" >&2
fi
rm -f "$log"
exit 0
