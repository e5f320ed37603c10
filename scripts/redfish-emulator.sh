#!/usr/bin/env bash
# sushy-tools' Redfish BMC emulator on loopback, with its fake systems driver (power state in
# memory, no hypervisor), entirely inside DIR: the BMCs the parking tests power nodes off and on.
#
#   scripts/redfish-emulator.sh start DIR PORT USER PASSWORD SYSTEM...   # waits until it answers
#   scripts/redfish-emulator.sh stop DIR
#
# Each SYSTEM becomes one ComputerSystem named SYSTEM (powered on), reachable as
# /redfish/v1/Systems/SYSTEM (the emulator redirects a name to the system's UUID). Every
# request but the service root needs HTTP basic auth as USER/PASSWORD (an htpasswd file with a
# bcrypt hash, the only digest it takes). Its state (SUSHY_EMULATOR_STATE_DIR) stays in DIR, so
# two runs never share systems. start writes DIR/env (REDFISH_URL=...). A power change reads
# back after the fake driver's own delay of 1 to 11 s, as a real BMC takes its time.
set -euo pipefail

cmd="${1:?start|stop}"; DIR="$(realpath -m "${2:?DIR}")"; shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUPOOL_SUSHY_VENV:-$ROOT/.services/sushy-venv}"
# shellcheck source=scripts/_lib.sh
. "$ROOT/scripts/_lib.sh"

stop() { kill_pidfiles TERM "$DIR/sushy-emulator.pid"; }

case "$cmd" in
  stop) stop ;;
  start)
    PORT="${1:?PORT}"; USER_="${2:?USER}"; PASSWORD="${3:?PASSWORD}"; shift 3
    [ "$#" -gt 0 ] || { echo "redfish-emulator: name at least one system" >&2; exit 2; }
    [ -x "$VENV/bin/sushy-emulator" ] || { echo "redfish-emulator: $VENV missing: run scripts/install-services.sh" >&2; exit 1; }
    mkdir -p "$DIR/state"
    HASH="$(PASSWORD="$PASSWORD" "$VENV/bin/python" -c \
      'import bcrypt, os; print(bcrypt.hashpw(os.environ["PASSWORD"].encode(), bcrypt.gensalt(4)).decode())')"
    printf '%s:%s\n' "$USER_" "$HASH" > "$DIR/htpasswd"
    {
      echo "SUSHY_EMULATOR_FAKE_DRIVER = True"
      echo "SUSHY_EMULATOR_STATE_DIR = '$DIR/state'"
      echo "SUSHY_EMULATOR_AUTH_FILE = '$DIR/htpasswd'"
      echo "SUSHY_EMULATOR_FAKE_SYSTEMS = ["
      i=0
      for name in "$@"; do
        i=$((i + 1))
        printf "    {'uuid': '00000000-0000-4000-8000-%012d', 'name': '%s', 'power_state': 'On', 'nics': []},\n" "$i" "$name"
      done
      echo "]"
    } > "$DIR/emulator.conf"
    setsid "$VENV/bin/sushy-emulator" --config "$DIR/emulator.conf" -i 127.0.0.1 -p "$PORT" \
      </dev/null >"$DIR/sushy-emulator.log" 2>&1 &
    echo $! > "$DIR/sushy-emulator.pid"
    for _ in $(seq 200); do
      if curl -fsS "http://127.0.0.1:$PORT/redfish/v1/" >/dev/null 2>&1; then
        echo "REDFISH_URL=http://127.0.0.1:$PORT" > "$DIR/env"
        echo "redfish-emulator: $# system(s) on 127.0.0.1:$PORT"; exit 0
      fi
      kill -0 "$(cat "$DIR/sushy-emulator.pid")" 2>/dev/null || break
      sleep 0.1
    done
    fail_with_logs redfish-emulator 20 "did not answer on 127.0.0.1:$PORT" "$DIR/sushy-emulator.log"
    ;;
  *) echo "usage: $0 start DIR PORT USER PASSWORD SYSTEM... | stop DIR" >&2; exit 2 ;;
esac
