#!/usr/bin/env bash
# Keystone + Placement on loopback, on SQLite, served by gunicorn, entirely inside DIR.
#
#   scripts/openstack-services.sh start DIR KEYSTONE_PORT PLACEMENT_PORT
#   scripts/openstack-services.sh stop DIR
#
# start writes DIR/credentials.json (mode 600: random passwords of admin, the placement
# service user and the gpupool reader) and DIR/env (KEYSTONE_URL, PLACEMENT_URL).
# Needs .services/openstack-venv (scripts/install-services.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUPOOL_OPENSTACK_VENV:-$ROOT/.services/openstack-venv}"
cmd="${1:?start|stop}"; DIR="$(realpath -m "${2:?DIR}")"

# shellcheck source=scripts/_lib.sh
. "$ROOT/scripts/_lib.sh"

stop() {
  kill_pidfiles INT "$DIR"/placement.pid "$DIR"/keystone.pid  # INT: gunicorn quick shutdown
}

fail() {
  fail_with_logs openstack-services 20 "$*" "$DIR"/keystone.log "$DIR"/placement.log "$DIR"/setup.log
}

wait_http() {  # URL PIDFILE
  for _ in $(seq 300); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$(cat "$2")" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR KEYSTONE_PORT PLACEMENT_PORT" >&2; exit 2; }
KPORT="${3:?KEYSTONE_PORT}"; PPORT="${4:?PLACEMENT_PORT}"
[ -x "$VENV/bin/gunicorn" ] || fail "$VENV missing: run scripts/install-services.sh"
KURL="http://127.0.0.1:$KPORT/v3"; PURL="http://127.0.0.1:$PPORT"
mkdir -p "$DIR/keystone" "$DIR/placement"

# keystone.conf and placement.conf for a state directory S (paths only; URLs come later).
write_confs() {  # S
  cat > "$1/keystone/keystone.conf" <<CONF
[DEFAULT]
log_file = $1/keystone.log
[database]
connection = sqlite:///$1/keystone.db
[token]
provider = fernet
[fernet_tokens]
key_repository = $1/fernet-keys
[fernet_receipts]
key_repository = $1/fernet-keys
[credential]
key_repository = $1/credential-keys
[identity]
# bcrypt's default cost makes each password check ~0.3 s on two cores; these are test users.
password_hash_rounds = 4
CONF
  cat > "$1/placement/placement.conf" <<CONF
[DEFAULT]
log_file = $1/placement.log
[api]
auth_strategy = keystone
[placement_database]
connection = sqlite:///$1/placement.db
[keystone_authtoken]
www_authenticate_uri = __KEYSTONE_URL__
auth_url = __KEYSTONE_URL__
auth_type = password
username = placement
password = __PLACEMENT_PW__
project_name = service
user_domain_name = Default
project_domain_name = Default
CONF
}

# Each keystone-manage / placement-manage run costs seconds of imports, so the migrated,
# bootstrapped databases and keys are made once per virtualenv (a template) and copied.
TEMPLATE="$VENV/state-template"
build_template() {
  local T="$TEMPLATE.tmp.$$"
  rm -rf "$T"; mkdir -p "$T/keystone" "$T/placement"
  write_confs "$T"
  local pw; pw="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
  local KM=("$VENV/bin/keystone-manage" --config-file "$T/keystone/keystone.conf")
  "${KM[@]}" db_sync
  "${KM[@]}" fernet_setup --keystone-user root --keystone-group root
  "${KM[@]}" credential_setup --keystone-user root --keystone-group root
  "${KM[@]}" bootstrap --bootstrap-password "$pw" --bootstrap-admin-url http://template.invalid/v3 \
    --bootstrap-public-url http://template.invalid/v3 --bootstrap-internal-url http://template.invalid/v3 \
    --bootstrap-region-id RegionOne
  "$VENV/bin/placement-manage" --config-file "$T/placement/placement.conf" db sync
  (umask 077; printf '{"admin": "%s"}' "$pw" > "$T/credentials.json")
  rm -f "$T"/*.log
  mv "$T" "$TEMPLATE"
}
(
  flock 9
  [ -f "$TEMPLATE/credentials.json" ] || build_template
) 9>"$VENV/.template.lock" >"$DIR/setup.log" 2>&1 || fail "building the keystone/placement template failed"

cp -a "$TEMPLATE/keystone.db" "$TEMPLATE/placement.db" "$TEMPLATE/fernet-keys" "$TEMPLATE/credential-keys" \
  "$TEMPLATE/credentials.json" "$DIR/"
chmod 600 "$DIR/credentials.json"
write_confs "$DIR"
sed -i "s|__KEYSTONE_URL__|$KURL|" "$DIR/placement/placement.conf"

# Fresh passwords for the service user and the reader, per start.
ADMIN_PW="$(sed -E 's/.*"admin": "([^"]+)".*/\1/' "$DIR/credentials.json")"
PLACEMENT_PW="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
GPUPOOL_PW="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
(umask 077; printf '{"admin": "%s", "placement": "%s", "gpupool": "%s"}' \
  "$ADMIN_PW" "$PLACEMENT_PW" "$GPUPOOL_PW" > "$DIR/credentials.json")
sed -i "s|__PLACEMENT_PW__|$PLACEMENT_PW|" "$DIR/placement/placement.conf"
chmod 600 "$DIR/placement/placement.conf"

# Both servers boot in parallel (their imports are the slow part); Placement only calls
# Keystone when the first request comes in.
OS_KEYSTONE_CONFIG_FILES="$DIR/keystone/keystone.conf" "$VENV/bin/gunicorn" \
  --chdir "$ROOT/scripts" --bind "127.0.0.1:$KPORT" --workers 1 --threads 4 --no-control-socket \
  --pid "$DIR/keystone.pid" --error-logfile "$DIR/keystone.log" --daemon wsgi_keystone:application \
  || fail "gunicorn (keystone) did not start"
OS_PLACEMENT_CONFIG_DIR="$DIR/placement" "$VENV/bin/gunicorn" \
  --chdir "$ROOT/scripts" --bind "127.0.0.1:$PPORT" --workers 1 --threads 4 --no-control-socket \
  --pid "$DIR/placement.pid" --error-logfile "$DIR/placement.log" --daemon wsgi_placement:application \
  || fail "gunicorn (placement) did not start"
for _ in $(seq 50); do [ -s "$DIR/keystone.pid" ] && [ -s "$DIR/placement.pid" ] && break; sleep 0.1; done
wait_http "$KURL" "$DIR/keystone.pid" || fail "keystone not answering on $KURL"

"$VENV/bin/python" "$ROOT/scripts/openstack_bootstrap.py" "$KURL" "$PURL" "$DIR/credentials.json" \
  >>"$DIR/setup.log" 2>&1 || fail "registering placement in keystone failed"
wait_http "$PURL" "$DIR/placement.pid" || fail "placement not answering on $PURL"

printf 'KEYSTONE_URL=%s\nPLACEMENT_URL=%s\n' "$KURL" "$PURL" > "$DIR/env"
echo "openstack-services: keystone $KURL, placement $PURL"
