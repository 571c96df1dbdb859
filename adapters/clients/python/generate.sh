#!/bin/sh
# Generates the Python client of Keel's HTTP API from its OpenAPI document, with a well-kept
# generator from Python's own ecosystem (PyPI `openapi-python-client`, pinned).
#
#   adapters/clients/python/generate.sh VENV_DIR OPENAPI_JSON OUT_DIR
#
# Installs the generator into VENV_DIR (tests/tools/python-venv.sh), then writes the package
# `keel_client` into OUT_DIR (replaced whole). The same document always gives the same bytes:
# the suite regenerates from a running `keel serve` and fails on any difference with the copy
# kept in adapters/clients/python/keel_client.
set -eu

VENV=${1:?usage: generate.sh VENV_DIR OPENAPI_JSON OUT_DIR}
DOCUMENT=${2:?usage: generate.sh VENV_DIR OPENAPI_JSON OUT_DIR}
OUT=${3:?usage: generate.sh VENV_DIR OPENAPI_JSON OUT_DIR}
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac

sh "$(dirname "$0")/../../../tests/tools/python-venv.sh" "$VENV" \
    "openapi-python-client==0.29.1" "ruff==0.17.6" "httpx==0.28.1" "attrs==26.1.0"
rm -rf "$OUT"
# The generator formats what it writes with ruff, which it finds on PATH.
RUFF_NO_CACHE=true PATH="$VENV/bin:$PATH" "$VENV/bin/openapi-python-client" generate \
    --path "$DOCUMENT" --output-path "$OUT" --meta none >&2
