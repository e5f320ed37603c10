#!/usr/bin/env bash
# A Prometheus on loopback whose history is backfilled from OpenMetrics files, inside DIR.
#
#   scripts/prometheus.sh backfill DIR FILE...   # promtool tsdb create-blocks-from openmetrics
#   scripts/prometheus.sh start DIR PORT         # waits until /-/ready
#   scripts/prometheus.sh stop DIR
#
# It scrapes nothing: every series comes from the backfill. Retention is long so that
# backfilled blocks of any age are kept (the default 15 days would drop old history).
set -euo pipefail

cmd="${1:?backfill|start|stop}"; DIR="$(realpath -m "${2:?DIR}")"; shift 2

case "$cmd" in
  backfill)
    mkdir -p "$DIR/data"
    for f in "$@"; do
      # 2h blocks: the default for a TSDB; larger ones would be compacted anyway.
      promtool tsdb create-blocks-from openmetrics "$f" "$DIR/data" >"$DIR/backfill.log" 2>&1 \
        || { echo "prometheus: backfill of $f failed:" >&2; tail -n 20 "$DIR/backfill.log" >&2; exit 1; }
    done
    ;;
  start)
    PORT="${1:?PORT}"
    mkdir -p "$DIR/data"
    printf 'global:\n  scrape_interval: 1m\nscrape_configs: []\n' > "$DIR/prometheus.yml"
    prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
      --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$PORT" \
      --query.max-samples=100000000 --log.level=warn >"$DIR/prometheus.log" 2>&1 &
    echo $! > "$DIR/prometheus.pid"
    for _ in $(seq 200); do
      if curl -fsS "http://127.0.0.1:$PORT/-/ready" >/dev/null 2>&1; then
        echo "prometheus: ready on 127.0.0.1:$PORT"; exit 0
      fi
      kill -0 "$(cat "$DIR/prometheus.pid")" 2>/dev/null || break
      sleep 0.1
    done
    echo "prometheus: not ready on 127.0.0.1:$PORT:" >&2; tail -n 20 "$DIR/prometheus.log" >&2
    kill "$(cat "$DIR/prometheus.pid")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    [ -f "$DIR/prometheus.pid" ] || exit 0
    pid="$(cat "$DIR/prometheus.pid")"; rm -f "$DIR/prometheus.pid"
    kill "$pid" 2>/dev/null || exit 0
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
    ;;
  *) echo "usage: $0 backfill|start|stop DIR ..." >&2; exit 2 ;;
esac
