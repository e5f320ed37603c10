# Shell helpers shared by the service scripts (sourced, not run).

# kill_pidfiles SIGNAL PIDFILE... : signal every daemon named by a pid file at once, wait up
# to 5 s for all of them to exit, then SIGKILL what is left. Pid files are removed.
kill_pidfiles() {
  local sig="$1"; shift
  local pids=() pidf pid alive
  for pidf in "$@"; do
    [ -f "$pidf" ] || continue
    pid="$(cat "$pidf")"; rm -f "$pidf"
    kill "-$sig" "$pid" 2>/dev/null && pids+=("$pid")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.05
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

# fail_with_logs NAME LINES LOG... : print NAME's error, the tail of each log, stop, exit 1
fail_with_logs() {
  local name="$1" lines="$2" msg="$3"; shift 3
  echo "$name: $msg" >&2
  for log in "$@"; do
    [ -f "$log" ] && { echo "--- $log (tail)" >&2; tail -n "$lines" "$log" >&2; }
  done
  stop
  exit 1
}

# group_alive PGID : whether a process of group PGID still runs (zombies, which an orphan's
# reaper may leave around for a while, do not count)
group_alive() {
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# kill_process_groups SIGNAL PIDFILE... : as kill_pidfiles, for daemons started with setsid whose
# pid is their process group: the signal reaches the whole group (children included).
kill_process_groups() {
  local sig="$1"; shift
  local pgids=() pidf pgid alive
  for pidf in "$@"; do
    [ -f "$pidf" ] || continue
    pgid="$(cat "$pidf")"; rm -f "$pidf"
    kill "-$sig" -- "-$pgid" 2>/dev/null && pgids+=("$pgid")
  done
  [ ${#pgids[@]} -eq 0 ] && return 0
  for _ in $(seq 200); do
    alive=0
    for pgid in "${pgids[@]}"; do group_alive "$pgid" && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.05
  done
  for pgid in "${pgids[@]}"; do kill -9 -- "-$pgid" 2>/dev/null || true; done
}
