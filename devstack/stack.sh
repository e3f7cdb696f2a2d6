#!/usr/bin/env bash
# The dev stack behind the Makefile: install what is missing, start Cassandra, apply the
# schema, run the API and a releaser. Usage: stack.sh setup|setup-test|run|up|down|key
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
VAR="$ROOT/var"
PORT="${DUETIME_HTTP_PORT:-8080}"
KEYSPACE="${DUETIME_KEYSPACE:-duetime}"
# one stack per port: its own pid files, so a second stack (the tests') never touches the first
API_PID="$VAR/run/api-$PORT.pid"
RELEASER_PID="$VAR/run/releaser-$PORT.pid"
# the dev key of the default keyspace is var/dev-key; another keyspace's has its own file
if [ "$KEYSPACE" = duetime ]; then KEYFILE="$VAR/dev-key"; else KEYFILE="$VAR/dev-key-$KEYSPACE"; fi
PY=python3
# a local stack POSTs to local receivers; production refuses non-public targets by default
export DUETIME_WEBHOOK_ALLOW="${DUETIME_WEBHOOK_ALLOW-127.0.0.0/8,::1}"
# plain text for people; production's default is JSON, a line an event
export DUETIME_LOG_FORMAT="${DUETIME_LOG_FORMAT-text}"
mkdir -p "$VAR/run" "$VAR/log"

need_apt() {  # install Debian packages whose command is missing
  local missing=()
  for pair in "$@"; do command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

setup_venv() {
  local stamp="$VENV/.installed-$(cat setup.cfg clients/python/pyproject.toml | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  echo "creating the virtualenv in .venv"
  # Debian ships venv's pip bootstrap apart from Python itself
  if [ ! -x "$VENV/bin/python" ] && ! $PY -c 'import ensurepip' 2>/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e ./clients/python -e ".[dev,spark]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
}

fetch_spark_jars() {  # the spark-cassandra-connector and its dependencies, once
  local version marker
  version=$(sed -n 's:.*<connector.version>\(.*\)</connector.version>.*:\1:p' devstack/spark-pom.xml)
  marker="$VAR/spark/jars/.fetched-$version"
  [ -f "$marker" ] && return 0
  echo "fetching spark-cassandra-connector $version with Maven"
  rm -rf "$VAR/spark/jars"
  mvn -B -q -f devstack/spark-pom.xml dependency:copy-dependencies -DincludeScope=runtime \
    -DexcludeArtifactIds=scala-library,scala-reflect,slf4j-api,commons-lang3,metrics-core \
    -DoutputDirectory="$VAR/spark/jars"
  touch "$marker"
}

setup() {
  need_apt java:openjdk-17-jre-headless mvn:maven curl:curl
  setup_venv
  fetch_spark_jars
  $PY devstack/cassandra.py start dev
  "$VENV/bin/duetime-admin" schema apply
}

dev_key() {  # reuse the key file while it still authenticates, else make a new one
  local keyfile="$KEYFILE"
  if [ -s "$keyfile" ] && "$VENV/bin/python" - "$(cat "$keyfile")" <<'PYEOF'
import sys
from app.config import load_config
from app.services import Services
s = Services(load_config())
sys.exit(0 if s.keys.tenant_of(sys.argv[1]) else 1)
PYEOF
  then cat "$keyfile"; return; fi
  "$VENV/bin/duetime-admin" keys create --tenant dev --name dev | tail -n 1 > "$keyfile"
  cat "$keyfile"
}

wait_ready() {
  for _ in $(seq 1 120); do
    curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "API did not become ready; see $VAR/log/api.log" >&2
  return 1
}

banner() {
  echo
  echo "duetime is up: http://127.0.0.1:$PORT/  (docs: http://127.0.0.1:$PORT/docs)"
  echo "a releaser runs too (log: var/log/releaser.log when started by make up)"
  echo "dev API key (tenant dev): $(dev_key)"
}

start_api_background() {
  if [ -f "$API_PID" ] && kill -0 "$(cat "$API_PID")" 2>/dev/null; then return; fi
  # not --daemon: a daemon's workers write their own events (app.ops.logs) to /dev/null
  nohup "$VENV/bin/gunicorn" -c app/gunicorn_conf.py --pid "$API_PID" app.wsgi:app \
    >>"$VAR/log/api.log" 2>&1 &
}

start_releaser_background() {
  if [ -f "$RELEASER_PID" ] && kill -0 "$(cat "$RELEASER_PID")" 2>/dev/null; then return; fi
  nohup "$VENV/bin/duetime-admin" releaser --member "$(hostname)-dev" >>"$VAR/log/releaser.log" 2>&1 &
  echo $! > "$RELEASER_PID"
}

stop_pidfile() {
  local pidfile=$1
  if [ -f "$pidfile" ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.2; done
    rm -f "$pidfile"
  fi
}

run() {
  local started_cassandra=0
  $PY devstack/cassandra.py status dev | grep -q "cql=up" || started_cassandra=1
  setup
  cleanup() {
    echo "stopping what make run started"
    [ -n "${API_PID:-}" ] && kill "$API_PID" 2>/dev/null || true
    [ -n "${RELEASER_PID:-}" ] && kill "$RELEASER_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ "$started_cassandra" = 1 ] && $PY devstack/cassandra.py stop dev || true
  }
  trap cleanup EXIT INT TERM
  "$VENV/bin/gunicorn" -c app/gunicorn_conf.py app.wsgi:app &
  API_PID=$!
  "$VENV/bin/duetime-admin" releaser --member "$(hostname)-dev" &
  RELEASER_PID=$!
  wait_ready
  banner
  echo "Ctrl-C stops it."
  wait -n "$API_PID" "$RELEASER_PID"
}

case "${1:-}" in
  setup) setup ;;
  # the suite drives the dashboard in Debian's headless Chromium
  setup-test) setup; need_apt chromium:chromium chromedriver:chromium-driver ;;
  run) run ;;
  up) setup; start_api_background; start_releaser_background; wait_ready; banner ;;
  down) for pidfile in "$VAR"/run/releaser*.pid "$VAR"/run/api*.pid; do stop_pidfile "$pidfile"; done
        $PY devstack/cassandra.py stop dev cluster solo ;;
  key) dev_key ;;
  *) echo "usage: $0 setup|setup-test|run|up|down|key" >&2; exit 2 ;;
esac
