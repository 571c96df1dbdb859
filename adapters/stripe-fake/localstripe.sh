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
# The venv is made by tests/tools/python-venv.sh (python3-venv installed with apt-get when
# missing and run as root; otherwise it says what is missing and exits 1).
#
# localstripe keeps its state in /tmp/localstripe.pickle, shared by every instance: this
# script never loads it (each server starts empty in memory), and callers clear the store with
# `DELETE /_config/data` before a scenario. Its own `localstripe` command would load that file
# and listen on every interface; this one listens on loopback only.
set -eu

VENV=${1:?usage: localstripe.sh VENV_DIR}
VERSION=1.15.10

sh "$(dirname "$0")/../../tests/tools/python-venv.sh" "$VENV" "localstripe==$VERSION"

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
