#!/usr/bin/env bash
# `make conformance`: the schemathesis CLI over the served openapi.yaml with every check, as a
# user of the tool runs it (no hooks): an API and a releaser of their own on port 18311, in a
# keyspace of their own (dropped afterwards), against the dev node. Its config file,
# devstack/schemathesis.toml, holds test data only: the ids of a message, campaign, schedule
# and operation created first (devstack/conformance_seed.py), so that the operations acting
# on one are tested past a 404.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT=${CONFORMANCE_PORT:-18311}
export DUETIME_KEYSPACE=duetime_conformance DUETIME_HTTP_PORT=$PORT DUETIME_API_METRICS_PORT=0 \
  DUETIME_RELEASER_METRICS_PORT=0 DUETIME_WAKE_PORT=0 DUETIME_RELEASE_RING=9500
LOG=var/log/conformance
mkdir -p "$LOG"
pids=()
finish() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  $BIN/python - <<'DROP' || true
from cassandra.cluster import Cluster
from app.config import load_config
cfg = load_config()
cluster = Cluster(list(cfg.contact_points), port=cfg.cql_port)
cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {cfg.keyspace}", timeout=120)
cluster.shutdown()
DROP
}
trap finish EXIT
$BIN/duetime-admin schema apply >/dev/null
KEY=$($BIN/duetime-admin keys create --tenant conformance | tail -1)
$BIN/gunicorn -c app/gunicorn_conf.py -b "127.0.0.1:$PORT" app.wsgi:app >"$LOG/api.log" 2>&1 &
pids+=($!)
$BIN/duetime-admin releaser --member conformance >"$LOG/releaser.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS -m 2 "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.3
done
SEED=$($BIN/python devstack/conformance_seed.py "http://127.0.0.1:$PORT" "$KEY")
eval "$SEED"
$BIN/st --config-file devstack/schemathesis.toml run "http://127.0.0.1:$PORT/openapi.yaml" --url "http://127.0.0.1:$PORT" \
  --checks all --seed "${CONFORMANCE_SEED:-1}" --max-examples "${CONFORMANCE_EXAMPLES:-30}" \
  --request-timeout 35 -H "Authorization: Bearer $KEY" "$@"
