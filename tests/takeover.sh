#!/usr/bin/env bash
# Takeover time of `keel worker` (issue 9), measured between real processes.
#
# Each round: a charge, then a refund that crashes right after its reservation; worker A
# recovers it and resends it, and the simulator holds that attempt's answer (the effect made
# first). While the attempt is in flight A is SIGKILLed (`kill`: a dead process, proven dead by
# /proc at once on this machine) or SIGSTOPped (`stop`: a stalled or partitioned worker, alive
# as far as the host can tell, so only its lease's expiry frees the run). Worker B is already
# running. Printed per round: A's lease expiry → the refund validated by B's lookup, and A's
# kill → validated, in ms; then the medians.
#
# Usage: tests/takeover.sh [ROUNDS] [LEASE_TTL_MS] [kill|stop] [postgres://USER@HOST:PORT/DATABASE]
# With a PostgreSQL URL each round runs in a fresh database made (and dropped) on that server
# (the user needs CREATEDB); the URL goes to keel by KEEL_STORE, never argv. Without one, a
# SQLite file. The binaries come from $CARGO_TARGET_DIR/debug (or target/debug); build them
# first with `cargo build --bins`. Needs jq, and sqlite3 or psql (on the PATH or under
# /usr/lib/postgresql/*/bin).
set -euo pipefail
rounds=${1:-5}
ttl=${2:-1000}
how=${3:-kill}
server=${4:-}
if [ -n "$server" ]; then
    psql=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1)
    [ -x "$psql" ] || { echo "takeover.sh: psql is needed for a PostgreSQL URL" >&2; exit 1; }
fi
bin=${CARGO_TARGET_DIR:-target}/debug
tenant=3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10
card=pm_card_visa_4242424242
poll=50
now_ms() { date +%s%3N; }

expiries=()
kills=()
for round in $(seq 1 "$rounds"); do
    dir=$(mktemp -d)
    echo '{"seed": 1, "rules": [{"operation": "refund", "fault": "slow", "times": 1, "ms": 2500}]}' >"$dir/plan.json"
    "$bin/keel-provider-sim" serve --db "$dir/sim.db" --faults "$dir/plan.json" >"$dir/sim.out" 2>"$dir/sim.err" &
    sim=$!
    until grep -q listening "$dir/sim.out" 2>/dev/null; do sleep 0.05; done
    url=$(grep -o 'http://[0-9.:]*' "$dir/sim.out")
    if [ -n "$server" ]; then
        db=keel_takeover_$$_$round
        "$psql" "$server" -qAtc "CREATE DATABASE $db" >/dev/null
        store="${server%/*}/$db"
        keel=(env "KEEL_STORE=$store" "$bin/keel")
        lease_expiry() { "$psql" "$store" -qAtc "SELECT expires_at FROM leases WHERE expires_at IS NOT NULL LIMIT 1"; }
    else
        keel=("$bin/keel" --db "$dir/keel.db")
        lease_expiry() { sqlite3 "$dir/keel.db" "SELECT expires_at FROM leases WHERE expires_at IS NOT NULL LIMIT 1"; }
    fi
    keel+=(--provider "$url" --provider-timeout-ms 3000 --provider-consistency-window-ms 0 --lease-ttl-ms "$ttl")
    "${keel[@]}" charge --tenant "$tenant" --intent-id order_1842_charge --order order_1842 --amount-minor 4900 \
        --currency EUR --payment-method-token "$card" >/dev/null
    # It aborts at the failpoint (SIGABRT), by design.
    (KEEL_FAILPOINT=after_reservation "${keel[@]}" refund --tenant "$tenant" --intent-id order_1842_refund \
        --order order_1842 --amount-minor 1000 --currency EUR >/dev/null 2>&1 || true) 2>/dev/null
    key="refund:$tenant:order_1842_refund"
    # Started from a subshell, so this shell does not report its SIGKILL as a job's death.
    a=$(
        "${keel[@]}" worker --poll-ms "$poll" --health-ms 60000 >"$dir/a.out" 2>"$dir/a.err" &
        echo $!
    )
    until [ "$("${keel[@]}" --json show "$key" | jq -r '[.status, .attempts] | join(" ")')" = "attempting 2" ]; do
        sleep 0.02
    done
    "${keel[@]}" worker --poll-ms "$poll" --health-ms 60000 >"$dir/b.out" 2>"$dir/b.err" &
    b=$!
    sleep 0.2 # B is up and polling before A goes.
    # A's lease as it stands when A goes (read first: once B takes the run over, the row is B's).
    expiry=$(lease_expiry)
    if [ "$how" = stop ]; then kill -STOP "$a"; else kill -KILL "$a"; fi
    killed=$(now_ms)
    until [ "$("${keel[@]}" --json show "$key" | jq -r .status)" = validated ]; do sleep 0.02; done
    validated=$("${keel[@]}" --json show "$key" | jq -r '.events[-1].at')
    validated_ms=$(date -d "$validated" +%s%3N)
    expiry_ms=$(date -d "$expiry" +%s%3N)
    expiries+=($((validated_ms - expiry_ms)))
    kills+=($((validated_ms - killed)))
    effects=$("$bin/keel-provider-sim" effects --json --db "$dir/sim.db" | grep -c order_1842_refund || true)
    echo "round $round ($how, lease ${ttl} ms): expiry → validated $((validated_ms - expiry_ms)) ms," \
        "kill → validated $((validated_ms - killed)) ms, effects on the refund: $effects"
    kill -KILL "$a" 2>/dev/null || true
    kill -TERM "$b" "$sim"
    wait "$b" "$sim" 2>/dev/null || true
    if [ -n "$server" ]; then "$psql" "$server" -qAtc "DROP DATABASE $db WITH (FORCE)" >/dev/null; fi
    rm -rf "$dir"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "median over $rounds rounds (${server:+postgres, }$how, --lease-ttl-ms $ttl, --poll-ms $poll): expiry → validated" \
    "$(median "${expiries[@]}") ms, kill → validated $(median "${kills[@]}") ms"
