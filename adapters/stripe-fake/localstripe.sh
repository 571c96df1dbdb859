#!/bin/sh
# Serves localstripe (a Stripe fake nobody here wrote) on a free loopback port, for checking
# Keel's Stripe adapter against it.
#
#   adapters/stripe-fake/localstripe.sh VENV_DIR
#
# Installs localstripe 1.15.10 into the Python venv VENV_DIR (created when missing; the tests
# use target/localstripe-venv), then serves it on 127.0.0.1 on a port the system picks, and
# prints that port alone on the first line of stdout. Everything else goes to stderr. It runs
# until killed.
#
# On a fresh machine with only python3 (Debian's, without ensurepip), it installs python3-venv
# with apt-get when run as root; otherwise it says what is missing and exits 1.
#
# localstripe keeps its state in /tmp/localstripe.pickle, shared by every instance: this
# script never loads it (each server starts empty in memory), and callers clear the store with
# `DELETE /_config/data` before a scenario. Its own `localstripe` command would load that file
# and listen on every interface; this one listens on loopback only.
set -eu

VENV=${1:?usage: localstripe.sh VENV_DIR}
VERSION=1.15.10

installed() {
    [ -x "$VENV/bin/python" ] &&
        "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('localstripe') != '$VERSION')" \
            2>/dev/null
}

# Two runs at once (two test processes) install one after the other, not over each other.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if ! installed; then
    rm -rf "$VENV"
    # Debian's python3 creates no venv without python3-venv (ensurepip): install it, once.
    if ! { command -v python3 >/dev/null 2>&1 && python3 -m venv "$VENV" >&2; }; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "localstripe.sh: installing python3-venv with apt-get" >&2
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
            rm -rf "$VENV"
            python3 -m venv "$VENV" >&2
        else
            echo "localstripe.sh: python3 -m venv fails: install python3 and python3-venv" >&2
            exit 1
        fi
    fi
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "localstripe==$VERSION" >&2
fi

# The server must not hold the install lock.
exec 9>&-
exec "$VENV/bin/python" -c '
import socket
from aiohttp import web
from localstripe.server import app

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, print=None)
'
