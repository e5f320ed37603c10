"""Regenerate docs/forecast-example.png and docs/forecast-example.json, the README's example:
`gpupool forecast` on three weeks of one Helios cluster's hourly GPU demand, 48 h ahead.

    .venv/bin/python docs/make_forecast_example.py [../shared/data/helios/vcpDC.csv]
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
trace = Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parents[1] / "shared" / "data" / "helios" / "vcpDC.csv")
raw = pd.read_csv(trace, parse_dates=["time"])
demand = (raw.set_index("time")[["running_gpu_num", "pending_gpu_num"]].sum(axis=1)).resample("1h").mean()
train, test = demand.iloc[: 21 * 24], demand.iloc[21 * 24 : 23 * 24]
with tempfile.TemporaryDirectory() as tmp:
    inp, out, summ = Path(tmp) / "in.csv", Path(tmp) / "out.csv", HERE / "forecast-example.json"
    train.rename("demand").to_csv(inp, index_label="timestamp")
    subprocess.run([sys.executable, "-m", "gpupool.cli", "forecast", str(inp), "--horizon", "48", "--out", str(out),
                    "--summary-json", str(summ)], check=True, stdout=subprocess.DEVNULL)
    fc = pd.read_csv(out, parse_dates=["timestamp"])
summary = json.loads(summ.read_text())
fig, ax = plt.subplots(figsize=(10, 3.4))
ax.plot(train.index[-7 * 24 :], train.iloc[-7 * 24 :], color="#0969da", lw=1, label="history (hourly demand)")
ax.plot(test.index, test, color="#57606a", lw=1, label="what happened")
ax.fill_between(fc["timestamp"], fc["yhat_lower"], fc["yhat_upper"], color="#bf8700", alpha=0.25, label="90% interval")
ax.plot(fc["timestamp"], fc["yhat"], color="#bf8700", lw=1.5, label="forecast")
ax.set_ylabel("GPUs")
ax.set_title(f"{trace.stem}: 48 h ahead", loc="left", fontsize=10)
ax.legend(loc="upper left", fontsize=8)
fig.tight_layout()
fig.savefig(HERE / "forecast-example.png", dpi=90)
keys = ("model", "order", "seasonal_order", "fourier", "criterion", "criterion_value", "adf_pvalues", "kpss_pvalues",
        "ljungbox_pvalue", "residual_ljungbox_pvalue", "residual_check_passed", "widened", "fallback")
print(json.dumps({k: summary.get(k) for k in keys}, indent=1, default=str))
