#!/usr/bin/env bash
# make demo: the whole DAG chain on the embedded virtual datacenter with a SQLite staging file.
#   scripts/demo.sh [WINDOW_END]   (default 2026-11-01T12:00:00+00:00)
set -euo pipefail
cd "$(dirname "$0")/.."
END="${1:-2026-11-01T12:00:00+00:00}"
BIN=.venv/bin
export AIRFLOW_HOME="${AIRFLOW_HOME:-$PWD/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$PWD/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-WARNING}"
export GPUPOOL_STAGING_URL="${GPUPOOL_STAGING_URL:-sqlite:///$AIRFLOW_HOME/gpupool_staging.db}"
mkdir -p "$AIRFLOW_HOME"

read -r HIST_START RUN_START <<<"$($BIN/python - "$END" <<'PY'
import sys, pandas as pd
end = pd.Timestamp(sys.argv[1])
end = end.tz_localize("UTC") if end.tzinfo is None else end.tz_convert("UTC")
print((end - pd.Timedelta(days=7, hours=1)).isoformat(), (end - pd.Timedelta(hours=1)).isoformat())
PY
)"

echo "== Airflow metadata and staging (AIRFLOW_HOME=$AIRFLOW_HOME)"
$BIN/airflow db migrate >/dev/null
$BIN/airflow pools set gpupool_actuation 1 "gpupool: one actuation at a time" >/dev/null
$BIN/gpupool db upgrade

echo "== history: one pass over the week before the run ($HIST_START .. $RUN_START), as a backfill would"
$BIN/gpupool run --start "$HIST_START" --end "$RUN_START" >/dev/null

echo "== airflow dags test gpupool_pipeline: window [$RUN_START, $END) (the hourly run whose data interval ends $END)"
LOG="$AIRFLOW_HOME/demo-dag-test.log"
if ! $BIN/airflow dags test gpupool_pipeline "$END" >"$LOG" 2>&1; then
  tail -n 60 "$LOG"; echo "DAG run failed; full log: $LOG"; exit 1
fi
STATE="$($BIN/airflow dags list-runs gpupool_pipeline -o json 2>/dev/null | $BIN/python -c '
import json, sys
text = sys.stdin.read()
line = next((l for l in text.splitlines() if l.startswith("[{") or l.strip() == "[]"), "[]")  # warnings come first
runs = json.loads(line)
print(runs[0]["state"] if runs else "none")')"
echo "DAG run state: $STATE"
if [ "$STATE" != "success" ]; then
  tail -n 60 "$LOG"; echo "DAG run did not succeed; full log: $LOG"; exit 1
fi
echo
$BIN/gpupool summary --start "$RUN_START" --end "$END"

echo
echo "== report of the last two days (plots + what-if under every policy)"
REPORT_START="$($BIN/python -c 'import sys, pandas as pd; print((pd.Timestamp(sys.argv[1]) - pd.Timedelta(days=2)).isoformat())' "$END")"
# the demo's own Airflow home: a report folder an older gpupool wrote there has no marker, and
# `gpupool report` refuses a folder it cannot tell it wrote, so the demo clears its own
[ -f "$AIRFLOW_HOME/report/.gpupool-report" ] || rm -rf "$AIRFLOW_HOME/report"
$BIN/gpupool report --start "$REPORT_START" --end "$END" --out "$AIRFLOW_HOME/report" >/dev/null
$BIN/python - "$AIRFLOW_HOME/report/whatif.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print("  each policy with the fast path beside the hourly plan (as shipped) and with the hourly plan alone (off)")
print(f"  {'policy':<11}{'fast path':>10}{'demand GPU-h':>14}{'unmet GPU-h':>13}{'utilization':>13}{'moves':>7}{'fast-path moves':>17}")
for r in rows:
    print(f"  {r['policy']:<11}{r.get('fastpath', 'off'):>10}{r['demand_gpu_hours']:>14.0f}{r['unmet_gpu_hours']:>13.1f}"
          f"{r['utilization']:>13.3f}{r['moves']:>7}{r.get('fastpath_moves', 0):>17}")
for r in rows:
    if r.get("note"):
        print(f"  {r['policy']} (fast path {r.get('fastpath', 'off')}): {r['note']}")
PY
echo
echo "report:   file://$AIRFLOW_HOME/report/index.html"
# standalone starts its children as `airflow ...` found on PATH: the venv goes first on it, and
# every value is shell-quoted so the command works as printed, from any directory
q() { printf '%q' "$1"; }
echo "pool page: cd $(q "$PWD") && PATH=$(q "$PWD/$BIN"):\"\$PATH\" AIRFLOW_HOME=$(q "$AIRFLOW_HOME") \\"
echo "           AIRFLOW__CORE__DAGS_FOLDER=$(q "$PWD/dags") AIRFLOW__CORE__PLUGINS_FOLDER=$(q "$PWD/plugins") \\"
echo "           AIRFLOW__CORE__LOAD_EXAMPLES=False GPUPOOL_STAGING_URL=$(q "$GPUPOOL_STAGING_URL") airflow standalone"
echo "           then open http://localhost:8080/gpupool/ (Browse -> GPU pool; the admin password is printed at start)"
echo "staging:  $GPUPOOL_STAGING_URL   DAG log: $LOG"
