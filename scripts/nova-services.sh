#!/usr/bin/env bash
# A real Nova on loopback, entirely inside DIR: nova-api, nova-conductor and one nova-compute with
# Nova's fake virt driver (no hypervisor), beside a Placement of its own.
#
#   scripts/nova-services.sh install                      # .services/nova-venv from PyPI (~3 min)
#   scripts/nova-services.sh start DIR API_PORT PLACEMENT_PORT
#   scripts/nova-services.sh stop DIR
#
# Uses the machine's PostgreSQL (127.0.0.1:5432, trust auth: three databases named after DIR, for
# the API, cell0 and cell1) and RabbitMQ (127.0.0.1:5672, a vhost named after DIR so two Novas never
# share RPC queues). No Keystone in front: the API trusts the X-User-Id / X-Project-Id / X-Roles
# headers (keystonecontext without authtoken), Placement runs with noauth2. start writes DIR/env
# (NOVA_URL=http://127.0.0.1:PORT/v2.1, COMPUTE_HOST=...) once the compute service is up and its
# hypervisor is mapped. It is what `python -m tests.contract.record_real nova-live` records from.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NOVA_VENV="${GPUPOOL_NOVA_VENV:-$ROOT/.services/nova-venv}"
OS_VENV="${GPUPOOL_OPENSTACK_VENV:-$ROOT/.services/openstack-venv}"
PG="${GPUPOOL_NOVA_PG:-postgresql+psycopg2://postgres@127.0.0.1:5432}"
cmd="${1:?install|start|stop}"
# shellcheck source=scripts/_lib.sh
. "$ROOT/scripts/_lib.sh"

if [ "$cmd" = install ]; then
  [ -x "$NOVA_VENV/bin/nova-compute" ] && { echo "nova-services: $NOVA_VENV ready"; exit 0; }
  python3 -m venv "$NOVA_VENV"
  "$NOVA_VENV/bin/pip" install -q -r "$ROOT/scripts/nova-requirements.txt"
  echo "nova-services: installed $("$NOVA_VENV/bin/pip" show nova | awk '/^Version/ {print $2}') in $NOVA_VENV"
  exit 0
fi

DIR="$(realpath -m "${2:?DIR}")"
TAG="gpupool_nova_$(printf %s "$DIR" | md5sum | cut -c1-10)"
DBS=("${TAG}_api" "${TAG}_cell0" "${TAG}_cell1")

stop() {
  kill_pidfiles TERM "$DIR"/api.pid "$DIR"/compute.pid "$DIR"/conductor.pid
  kill_pidfiles INT "$DIR"/placement.pid
  for db in "${DBS[@]}"; do psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; done
  rabbitmqctl -q delete_vhost "$TAG" >/dev/null 2>&1 || true
}

fail() {
  fail_with_logs nova-services 20 "$*" "$DIR"/logs/setup.log "$DIR"/logs/nova-conductor.log \
    "$DIR"/logs/nova-compute.log "$DIR"/logs/api.log "$DIR"/logs/placement.log
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 install | start DIR API_PORT PLACEMENT_PORT | stop DIR" >&2; exit 2; }
APORT="${3:?API_PORT}"; PPORT="${4:?PLACEMENT_PORT}"
[ -x "$NOVA_VENV/bin/nova-compute" ] || { echo "nova-services: run $0 install first" >&2; exit 1; }
[ -x "$OS_VENV/bin/placement-manage" ] || { echo "nova-services: $OS_VENV missing: run scripts/install-services.sh" >&2; exit 1; }
HOST="gpupool-fake-compute1"
NOVA_URL="http://127.0.0.1:$APORT/v2.1"
mkdir -p "$DIR"/{logs,state,locks,placement}
: > "$DIR/logs/setup.log"

for db in "${DBS[@]}"; do
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" >>"$DIR/logs/setup.log" 2>&1
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $db" >>"$DIR/logs/setup.log" 2>&1 || fail "cannot create database $db"
done
rabbitmqctl -q delete_vhost "$TAG" >/dev/null 2>&1 || true
rabbitmqctl -q add_vhost "$TAG" >>"$DIR/logs/setup.log" 2>&1 || fail "cannot add RabbitMQ vhost $TAG"
rabbitmqctl -q set_permissions -p "$TAG" guest ".*" ".*" ".*" >>"$DIR/logs/setup.log" 2>&1 || fail "RabbitMQ permissions"

cat > "$DIR/placement/placement.conf" <<CONF
[api]
auth_strategy = noauth2
[placement_database]
connection = sqlite:///$DIR/placement.db
CONF
"$OS_VENV/bin/placement-manage" --config-file "$DIR/placement/placement.conf" db sync >>"$DIR/logs/setup.log" 2>&1 \
  || fail "placement-manage db sync failed"
OS_PLACEMENT_CONFIG_DIR="$DIR/placement" "$OS_VENV/bin/gunicorn" --chdir "$ROOT/scripts" \
  --bind "127.0.0.1:$PPORT" --workers 1 --threads 2 --no-control-socket --pid "$DIR/placement.pid" \
  --error-logfile "$DIR/logs/placement.log" --daemon wsgi_placement:application || fail "placement did not start"

sed -e 's/ authtoken keystonecontext / keystonecontext /' "$NOVA_VENV/etc/nova/api-paste.ini" > "$DIR/api-paste.ini"
grep -q ' authtoken ' "$DIR/api-paste.ini" && fail "api-paste.ini: could not take authtoken out of the pipeline"
cat > "$DIR/nova.conf" <<CONF
[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:5672/$TAG
compute_driver = fake.FakeDriver
host = $HOST
state_path = $DIR/state
log_dir = $DIR/logs
[api_database]
connection = $PG/${TAG}_api
[database]
connection = $PG/${TAG}_cell1
[oslo_concurrency]
lock_path = $DIR/locks
[placement]
auth_type = admin_token
token = admin
endpoint = http://127.0.0.1:$PPORT
[scheduler]
discover_hosts_in_cells_interval = -1
[wsgi]
api_paste_config = $DIR/api-paste.ini
CONF
manage() { "$NOVA_VENV/bin/nova-manage" --config-file "$DIR/nova.conf" "$@" >>"$DIR/logs/setup.log" 2>&1; }
manage api_db sync || fail "nova-manage api_db sync failed"
manage cell_v2 map_cell0 --database_connection "$PG/${TAG}_cell0" || fail "nova-manage cell_v2 map_cell0 failed"
manage cell_v2 create_cell --name cell1 || fail "nova-manage cell_v2 create_cell failed"
manage db sync || fail "nova-manage db sync failed"

for svc in conductor compute; do
  setsid "$NOVA_VENV/bin/nova-$svc" --config-file "$DIR/nova.conf" </dev/null >"$DIR/logs/$svc.out" 2>&1 &
  echo $! > "$DIR/$svc.pid"
done
OS_NOVA_CONFIG_DIR="$DIR" "$NOVA_VENV/bin/gunicorn" --chdir "$ROOT/scripts" --bind "127.0.0.1:$APORT" \
  --workers 1 --threads 4 --timeout 120 --no-control-socket --pid "$DIR/api.pid" \
  --error-logfile "$DIR/logs/api.log" --daemon wsgi_nova_api:application || fail "nova-api did not start"

H=(-H "X-User-Id: gpupool" -H "X-Project-Id: gpupool" -H "X-Roles: admin,member,reader")
up=""
for _ in $(seq 240); do
  up="$(curl -fsS -m 10 "${H[@]}" "$NOVA_URL/os-services?binary=nova-compute" 2>/dev/null || true)"
  case "$up" in *'"state": "up"'*) break ;; esac
  for p in conductor compute; do kill -0 "$(cat "$DIR/$p.pid")" 2>/dev/null || fail "nova-$p exited"; done
  sleep 0.5
done
case "$up" in *'"state": "up"'*) ;; *) fail "nova-compute not up after 120 s" ;; esac
manage cell_v2 discover_hosts || fail "nova-manage cell_v2 discover_hosts failed"
for _ in $(seq 120); do
  hv="$(curl -fsS -m 10 "${H[@]}" "$NOVA_URL/os-hypervisors" 2>/dev/null || true)"
  case "$hv" in *"\"$HOST\""*) break ;; esac
  sleep 0.5
done
case "$hv" in *"\"$HOST\""*) ;; *) fail "hypervisor $HOST not listed after discover_hosts" ;; esac
printf 'NOVA_URL=%s\nCOMPUTE_HOST=%s\n' "$NOVA_URL" "$HOST" > "$DIR/env"
echo "nova-services: nova-api $NOVA_URL, compute $HOST (fake driver), placement :$PPORT"
