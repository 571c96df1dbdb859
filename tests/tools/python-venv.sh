#!/bin/sh
# Makes a Python virtual environment holding exactly the pinned packages the tests need from
# PyPI (programs nobody here wrote: localstripe, schemathesis, openapi-spec-validator).
#
#   tests/tools/python-venv.sh VENV_DIR NAME==VERSION [NAME==VERSION ...]
#
# Creates VENV_DIR when missing and installs the pins into it; does nothing when every pin is
# already installed at its version. On a fresh machine with only python3 (Debian's, without
# ensurepip) it installs python3-venv with apt-get when run as root; otherwise it says what is
# missing and exits 1 — a suite that needs it fails, it never skips. Two test processes that
# run it at once install one after the other (flock on VENV_DIR.lock). Prints nothing on
# stdout; progress and errors go to stderr.
set -eu

VENV=${1:?usage: python-venv.sh VENV_DIR NAME==VERSION ...}
shift
[ $# -gt 0 ] || { echo "python-venv.sh: name at least one NAME==VERSION" >&2; exit 2; }

installed() {
    [ -x "$VENV/bin/python" ] || return 1
    for pin in "$@"; do
        name=${pin%%==*}
        version=${pin#*==}
        "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$name') != '$version')" \
            2>/dev/null || return 1
    done
}

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if ! installed "$@"; then
    # Debian's python3 creates no venv without python3-venv (ensurepip): install it, once.
    if ! { [ -x "$VENV/bin/pip" ] || { command -v python3 >/dev/null 2>&1 && python3 -m venv "$VENV" >&2; }; }; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "python-venv.sh: installing python3-venv with apt-get" >&2
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
            rm -rf "$VENV"
            python3 -m venv "$VENV" >&2
        else
            echo "python-venv.sh: python3 -m venv fails: install python3 and python3-venv" >&2
            exit 1
        fi
    fi
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
fi
