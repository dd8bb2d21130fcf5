#!/usr/bin/env bash
# What the console's browser test needs, installed when missing: Debian's
# Chromium (the browser; Playwright never downloads one) and playwright-core
# (pinned in package-lock.json) in tests/ui/node_modules (ignored by git).
set -euo pipefail
cd "$(dirname "$0")"
# Several tests run this at once: one installs, the others wait for it (on
# a fresh machine two apt-get runs race for dpkg's lock and one fails).
exec 9>"${TMPDIR:-/tmp}/tessera-ui-setup.lock"
flock 9
if [ ! -x /usr/bin/chromium ]; then
    echo "tests/ui: installing Debian's chromium" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d node_modules/playwright-core ]; then
    echo "tests/ui: installing playwright-core" >&2
    npm ci --no-audit --no-fund --silent
fi
