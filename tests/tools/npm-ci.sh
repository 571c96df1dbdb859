#!/bin/sh
# Installs a Node package's dependencies from its lockfile, for the tests that run programs
# nobody here wrote from npm (openapi-typescript, tsx, typescript).
#
#   tests/tools/npm-ci.sh PACKAGE_DIR
#
# Runs `npm ci` in PACKAGE_DIR. On a machine without node and npm it installs Debian's nodejs
# and npm with apt-get when run as root; otherwise it says what is missing and exits 1 — a
# suite that needs it fails, it never skips. Progress and errors go to stderr.
set -eu

DIR=${1:?usage: npm-ci.sh PACKAGE_DIR}

if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "npm-ci.sh: installing nodejs and npm with apt-get" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
    else
        echo "npm-ci.sh: npm is missing: install nodejs and npm" >&2
        exit 1
    fi
fi
cd "$DIR"
npm ci --no-audit --no-fund >&2
