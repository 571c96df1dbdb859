#!/usr/bin/env bash
# Mutation testing of the decision code (issue 14): cargo-mutants over the files and with the
# tests that `.cargo/mutants.toml` names (every package's). Not part of CI: on two cores a
# mutant costs 3–4 minutes against every package, or seconds with `--test-workspace=false`
# (its own crate's tests only: the quick pass, see the README), so the whole scope takes
# days. Narrow it with `--re`, a regex over the mutant names that `--list` prints
# (`FILE:LINE:COL: replace … in FUNCTION`); `--file` cannot narrow, it adds to the config's
# globs:
#
#   tests/mutants.sh --list                                        # what would be generated
#   tests/mutants.sh --re 'engine/agent/src/guard\.rs:'            # one file
#   tests/mutants.sh --re 'in Decider.*::(reserve|reserve_again)'   # functions
#   tests/mutants.sh --shard 3/10                                  # a tenth of everything
#   tests/mutants.sh --iterate ...                                 # only what was not caught last time
#   tests/mutants.sh --in-place ...                                # mutate this tree, no copy
#
# Without `--in-place` cargo-mutants copies the tree and builds it from scratch once (a few
# minutes); `--in-place` reuses ./target but leaves a mutant in the sources if it is killed
# hard (`git diff` shows it). cargo-mutants 27 also keeps one "delete field" mutant whatever
# `--re` says (today `Ledger::per_stream`'s, engine/src/ledger/whole.rs; always caught).
#
# Results land in mutants.out/ (caught.txt, missed.txt, timeout.txt, unviable.txt). Each
# mutant's tests are bounded by MUTANTS_TIMEOUT_S (default 180 s); a mutant that loops
# forever is reported as a timeout, not waited for. The proptest model runs
# PROPTEST_CASES (default 100) cases without shrinking: a mutant needs one failing case.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-mutants >/dev/null 2>&1; then
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 2
fi
if ! command -v cargo-nextest >/dev/null 2>&1; then
    echo "cargo-nextest is not installed: cargo install cargo-nextest --locked" >&2
    exit 2
fi

export PROPTEST_CASES="${PROPTEST_CASES:-100}"
export PROPTEST_MAX_SHRINK_ITERS="${PROPTEST_MAX_SHRINK_ITERS:-0}"
exec cargo mutants --workspace --timeout "${MUTANTS_TIMEOUT_S:-180}" "$@"
