#!/usr/bin/env bash
# Gnocchi on loopback for the integration tests: PostgreSQL indexer, file storage in DIR, its
# REST API under gunicorn with Keystone auth, registered as the `metric` service of a Keystone
# started by openstack-services.sh.
#
#   scripts/gnocchi-services.sh start DIR PORT KEYSTONE_URL CREDENTIALS_JSON INDEXER_URL
#   scripts/gnocchi-services.sh stop DIR
#
# INDEXER_URL names an existing, empty PostgreSQL database (postgresql://user@host:port/db);
# CREDENTIALS_JSON is openstack-services.sh's (admin's password registers the service).
# No gnocchi-metricd runs: the tests process new measures with the API's `refresh=true`.
# start writes DIR/env (GNOCCHI_URL). Needs .services/openstack-venv (scripts/install-services.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUPOOL_OPENSTACK_VENV:-$ROOT/.services/openstack-venv}"
cmd="${1:?start|stop}"; DIR="$(realpath -m "${2:?DIR}")"

# shellcheck source=scripts/_lib.sh
. "$ROOT/scripts/_lib.sh"

stop() {
  kill_pidfiles INT "$DIR"/gnocchi.pid  # INT: gunicorn quick shutdown
  if [ -f "$DIR/registered" ]; then
    read -r kurl creds < "$DIR/registered"
    # Keystone may already be gone at the end of a session: then there is nothing to take out.
    "$VENV/bin/python" "$ROOT/scripts/gnocchi_bootstrap.py" unregister "$kurl" "$creds" \
      >>"$DIR/setup.log" 2>&1 || true
    rm -f "$DIR/registered"
  fi
}

fail() {
  fail_with_logs gnocchi-services 25 "$*" "$DIR"/gnocchi.log "$DIR"/gunicorn.log "$DIR"/setup.log
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start DIR PORT KEYSTONE_URL CREDENTIALS_JSON INDEXER_URL | stop DIR" >&2; exit 2; }
PORT="${3:?PORT}"; KURL="${4:?KEYSTONE_URL}"; CREDS="$(realpath "${5:?CREDENTIALS_JSON}")"; INDEXER="${6:?INDEXER_URL}"
[ -x "$VENV/bin/gnocchi-upgrade" ] || fail "$VENV has no gnocchi: run scripts/install-services.sh"
GURL="http://127.0.0.1:$PORT"
mkdir -p "$DIR/storage"
PW="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
(umask 077; cat > "$DIR/gnocchi.conf" <<CONF
[DEFAULT]
log_file = $DIR/gnocchi.log
parallel_operations = 2
[api]
auth_mode = keystone
paste_config = $DIR/api-paste.ini
host = 127.0.0.1
port = $PORT
[indexer]
url = $INDEXER
[storage]
driver = file
file_basepath = $DIR/storage
[keystone_authtoken]
www_authenticate_uri = $KURL
auth_url = $KURL
auth_type = password
username = gnocchi
password = $PW
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = RegionOne
CONF
)

# Gnocchi's own paste file, except that keystonemiddleware (which builds its configuration
# afresh for project "gnocchi", from /etc/gnocchi unless told) reads its options from this file.
paste_src=("$VENV"/lib/python3*/site-packages/gnocchi/rest/api-paste.ini)
sed "/^\[filter:keystone_authtoken\]/,/^\[/ s|^oslo_config_project = gnocchi\$|&\noslo_config_file = $DIR/gnocchi.conf|" \
    "${paste_src[0]}" \
  > "$DIR/api-paste.ini"
grep -q "^oslo_config_file = $DIR/gnocchi.conf\$" "$DIR/api-paste.ini" || fail "gnocchi's api-paste.ini has no keystone_authtoken filter to configure"

# Registering in Keystone and creating the indexer's schema are both mostly imports: in parallel.
"$VENV/bin/python" "$ROOT/scripts/gnocchi_bootstrap.py" register "$KURL" "$GURL" "$CREDS" "$PW" \
  >"$DIR/setup.log" 2>&1 &
register=$!
"$VENV/bin/gnocchi-upgrade" --config-file "$DIR/gnocchi.conf" >>"$DIR/setup.log" 2>&1 \
  || { wait "$register" || true; fail "gnocchi-upgrade failed"; }
wait "$register" || fail "registering gnocchi in keystone failed"
echo "$KURL $CREDS" > "$DIR/registered"

GNOCCHI_CONFIG_FILE="$DIR/gnocchi.conf" "$VENV/bin/gunicorn" \
  --chdir "$ROOT/scripts" --bind "127.0.0.1:$PORT" --workers 1 --threads 4 --no-control-socket \
  --pid "$DIR/gnocchi.pid" --error-logfile "$DIR/gunicorn.log" --daemon wsgi_gnocchi:application \
  || fail "gunicorn (gnocchi) did not start"
for _ in $(seq 50); do [ -s "$DIR/gnocchi.pid" ] && break; sleep 0.1; done
# The versions document at / needs no token; it answers once the application is loaded.
for _ in $(seq 600); do
  curl -fsS -o /dev/null "$GURL/" 2>/dev/null && break
  kill -0 "$(cat "$DIR/gnocchi.pid" 2>/dev/null)" 2>/dev/null || fail "gunicorn (gnocchi) exited: $(tail -n 5 "$DIR/gunicorn.log" 2>/dev/null)"
  sleep 0.1
done
curl -fsS -o /dev/null "$GURL/" || fail "gnocchi not answering on $GURL"

printf 'GNOCCHI_URL=%s\n' "$GURL" > "$DIR/env"
echo "gnocchi-services: gnocchi $GURL (indexer $INDEXER)"
