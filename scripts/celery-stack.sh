#!/usr/bin/env bash
# The topology of docker-compose.yaml on loopback, without Docker, entirely inside DIR:
# Airflow 3 with the CeleryExecutor (api-server, scheduler, dag-processor, triggerer and
# WORKERS Celery workers with distinct host names), Redis as the broker, PostgreSQL for Airflow's
# metadata (and Celery's results) and, in a database of its own, for gpupool's staging.
#
#   scripts/celery-stack.sh start DIR   # (re)creates both databases, migrates, starts, waits
#   scripts/celery-stack.sh stop DIR
#
# Settings (environment, with defaults):
#   STACK_NAME=gpupool       databases ${STACK_NAME}_airflow and ${STACK_NAME}_staging, Celery queue
#   PG_SERVER=postgresql://postgres@127.0.0.1:5432   the PostgreSQL server (its `postgres` db admin)
#   REDIS_URL=redis://127.0.0.1:6379/0               the broker
#   API_PORT=8080  LOG_PORTS="8794 8793 8795"  (the triggerer's log server, then one per worker)
#   WORKERS=2  WORKER_CONCURRENCY=1  ADMIN_PASSWORD=admin  PYTHON=<repo>/.venv/bin/python
# Any AIRFLOW__* / GPUPOOL_* variable set by the caller reaches every process (e.g. GPUPOOL_CONFIG).
#
# start writes DIR/env (export lines: every Airflow setting of the stack, the staging URL, the
# API's URL) to source before running `airflow` or `gpupool` against the stack; each process
# runs in a session of its own, its pid in DIR/<name>.pid and its log in DIR/<name>.log;
# DIR/services lists each one's name and command (tests/e2e/test_celery_stack.py compares them
# with docker-compose.yaml).
# Workers are w1, w2, ...: Celery host name `wN@<host>`, which is also the host name their task
# instances record (GPUPOOL_WORKER_HOSTNAME, read by gpupool.hostname.worker_hostname).
set -euo pipefail

cmd="${1:?start|stop}"; DIR="$(realpath -m "${2:?DIR}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/_lib.sh
. "$ROOT/scripts/_lib.sh"

STACK_NAME="${STACK_NAME:-gpupool}"
PG_SERVER="${PG_SERVER:-postgresql://postgres@127.0.0.1:5432}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
API_PORT="${API_PORT:-8080}"
LOG_PORTS="${LOG_PORTS:-8794 8793 8795}"
WORKERS="${WORKERS:-2}"
WORKER_CONCURRENCY="${WORKER_CONCURRENCY:-1}"
ADMIN_PASSWORD="${ADMIN_PASSWORD:-admin}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
META_DB="${STACK_NAME}_airflow"
STAGING_DB="${STACK_NAME}_staging"
HOST="$(hostname -s)"
SERVICES=(api-server scheduler dag-processor triggerer)

pidfiles() {
  local f=()
  for s in "${SERVICES[@]}"; do f+=("$DIR/$s.pid"); done
  for f2 in "$DIR"/worker-w*.pid; do [ -e "$f2" ] && f+=("$f2"); done
  echo "${f[@]}"
}

stop() {
  # every process group at once: a worker's pool children and the task processes go with it
  # shellcheck disable=SC2046
  kill_process_groups TERM $(pidfiles)
}

fail() {
  local logs=("$DIR/init.log")
  for s in "${SERVICES[@]}"; do logs+=("$DIR/$s.log"); done
  for l in "$DIR"/worker-w*.log; do [ -e "$l" ] && logs+=("$l"); done
  fail_with_logs celery-stack 20 "$*" "${logs[@]}"
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ -x "$PYTHON" ] || { echo "celery-stack: no Python at $PYTHON (set PYTHON)" >&2; exit 1; }
read -r -a log_ports <<<"$LOG_PORTS"
[ "${#log_ports[@]}" -gt "$WORKERS" ] || { echo "celery-stack: LOG_PORTS needs $((WORKERS + 1)) ports" >&2; exit 2; }
mkdir -p "$DIR/home"
stop  # a previous start in DIR

# --- the broker answers; databases: Airflow's metadata and gpupool's staging, each its own --
pg_isready -q -d "$PG_SERVER/postgres" || { echo "celery-stack: the PostgreSQL server (PG_SERVER) does not answer" >&2; exit 1; }
"$PYTHON" -c 'import redis, sys; redis.Redis.from_url(sys.argv[1], socket_timeout=5).ping()' "$REDIS_URL" 2>/dev/null \
  || { echo "celery-stack: the Redis broker (REDIS_URL) does not answer" >&2; exit 1; }
for db in "$META_DB" "$STAGING_DB"; do
  psql -q -v ON_ERROR_STOP=1 -d "$PG_SERVER/postgres" \
    -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" -c "CREATE DATABASE \"$db\"" >/dev/null \
    || { echo "celery-stack: could not (re)create database $db on the PostgreSQL server" >&2; exit 1; }
done

# --- the settings of every process (the compose file's x-airflow-common environment) ----------
JWT_SECRET="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '{"admin": "%s"}\n' "$ADMIN_PASSWORD" > "$DIR/home/passwords.json"
pg_psycopg2="postgresql+psycopg2://${PG_SERVER#postgresql://}"
cat > "$DIR/env" <<EOF
export AIRFLOW_HOME='$DIR/home'
export AIRFLOW__CORE__DAGS_FOLDER='${AIRFLOW__CORE__DAGS_FOLDER:-$ROOT/dags}'
export AIRFLOW__CORE__PLUGINS_FOLDER='${AIRFLOW__CORE__PLUGINS_FOLDER:-$ROOT/plugins}'
export AIRFLOW__CORE__EXECUTOR=CeleryExecutor
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE='$DIR/home/passwords.json'
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN='$pg_psycopg2/$META_DB'
export AIRFLOW__CELERY__RESULT_BACKEND='db+${PG_SERVER}/$META_DB'
export AIRFLOW__CELERY__BROKER_URL='$REDIS_URL'
export AIRFLOW__OPERATORS__DEFAULT_QUEUE='$STACK_NAME'
export AIRFLOW__CELERY__WORKER_CONCURRENCY='$WORKER_CONCURRENCY'
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION='${AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION:-True}'
export AIRFLOW__CORE__HOSTNAME_CALLABLE=gpupool.hostname.worker_hostname
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT='$API_PORT'
export AIRFLOW__API__WORKERS=1
export AIRFLOW__API__BASE_URL='http://127.0.0.1:$API_PORT'
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL='http://127.0.0.1:$API_PORT/execution/'
export AIRFLOW__API_AUTH__JWT_SECRET='$JWT_SECRET'
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT='${log_ports[0]}'
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=False
export AIRFLOW_CONN_GPUPOOL_STAGING='$PG_SERVER/$STAGING_DB'
export GPUPOOL_STAGING_URL='$PG_SERVER/$STAGING_DB'
export GPUPOOL_API_URL='http://127.0.0.1:$API_PORT'
export PATH='$(dirname "$PYTHON"):$PATH'
EOF
# shellcheck source=/dev/null
. "$DIR/env"

# --- init (the compose file's airflow-init) ---------------------------------------------------
{
  "$PYTHON" -m airflow db migrate &&
  "$PYTHON" -m airflow pools set gpupool_actuation 1 "gpupool: one actuation at a time" &&
  "$PYTHON" -m gpupool.cli db upgrade
} >"$DIR/init.log" 2>&1 || fail "init (airflow db migrate, pools, gpupool db upgrade) failed"

# --- the services, each in a session of its own ----------------------------------------------
launch() {  # NAME ARGS... : start `airflow ARGS` as NAME
  local name="$1"; shift
  setsid "$PYTHON" -m airflow "$@" >"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
  printf '%s\tairflow %s\n' "$name" "$*" >> "$DIR/services"
}
: > "$DIR/services"
launch api-server api-server
launch scheduler scheduler
launch dag-processor dag-processor
launch triggerer triggerer
workers=()
for i in $(seq "$WORKERS"); do
  w="w$i@$HOST"; workers+=("$w")
  GPUPOOL_WORKER_HOSTNAME="$w" AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT="${log_ports[$i]}" \
    launch "worker-w$i" celery worker --celery-hostname "$w" --concurrency "$WORKER_CONCURRENCY" \
      --queues "$STACK_NAME"
done

# --- wait: the API healthy with a live scheduler, dag-processor and triggerer; every worker
# answering a Celery ping on the broker
alive() {
  local f
  for f in $(pidfiles); do kill -0 "$(cat "$f")" 2>/dev/null || { echo "$(basename "$f" .pid)"; return 1; }; done
}
healthy=0
for _ in $(seq 120); do
  dead="$(alive)" || fail "$dead exited"
  if health="$(curl -fsS "http://127.0.0.1:$API_PORT/api/v2/monitor/health" 2>/dev/null)" \
      && "$PYTHON" -c 'import json,sys; h=json.loads(sys.argv[1]); sys.exit(any((h.get(k) or {}).get("status") != "healthy" for k in ("metadatabase","scheduler","triggerer","dag_processor")))' "$health"; then
    healthy=1; break
  fi
  sleep 2
done
[ "$healthy" = 1 ] || fail "API on 127.0.0.1:$API_PORT not healthy in 240 s"
for _ in $(seq 60); do
  dead="$(alive)" || fail "$dead exited"
  pong="$("$PYTHON" -m celery --app airflow.providers.celery.executors.celery_executor.app \
          inspect ping --timeout 2 -d "$(IFS=,; echo "${workers[*]}")" 2>/dev/null || true)"
  missing=0
  for w in "${workers[@]}"; do grep -q "$w: OK" <<<"$pong" || missing=1; done
  if [ "$missing" = 0 ]; then
    echo "celery-stack: ready on http://127.0.0.1:$API_PORT (workers: ${workers[*]}; source $DIR/env)"
    exit 0
  fi
  sleep 1
done
fail "workers ${workers[*]} did not all answer a Celery ping in 60 s"
