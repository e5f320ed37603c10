"""M4 Hourly benchmark of the demand forecaster against seasonal naive and Prophet.

    python bench/forecast_m4.py [--data ../shared/data/m4] [--limit N] [--stride S] [--jobs J] [--prophet N]

``auto`` is what ``gpupool forecast`` and the pipeline run (:class:`AutoForecaster`: the model
chosen per series by validation inside its history); ``arima`` is the plain ARIMA procedure.

For every series (414 unless ``--limit``/``--stride``): fit on the training part, forecast
h = 48, score MASE (scaled by the in-sample seasonal naive with m = 24), the share of test points
inside the 90% interval, and the CPU seconds of fit + predict (Prophet's include its Stan child
process). Prophet can be restricted to ``--prophet N`` evenly spaced series (0 skips it); its
figures are printed with ARIMA's and seasonal naive's on exactly the series Prophet ran on.
Prophet uses daily and weekly seasonality and a 90% interval width; ARIMA gets ``season=24`` as
the hint, the same settings for every series.

Bars (issue 14, on every 8th series: ``--stride 8``): mean MASE of ``auto`` <= 0.92, coverage in
[85%, 95%], no NaN, <= 3 CPU-s per ``gpupool forecast`` call, process start included (``--cli``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one series per core; BLAS threads would only contend

import argparse  # noqa: E402
import ast  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpupool.forecast.arima import ArimaForecaster  # noqa: E402
from gpupool.forecast.baselines import SeasonalNaiveForecaster  # noqa: E402
from gpupool.forecast.select import AutoForecaster  # noqa: E402

HORIZON = 48
SEASON = 24
LEVEL = 90
DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "m4"


def load(data: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(id, train values, test values) for every M4 Hourly series, in file order."""
    train = pd.read_csv(data / "Hourly-train.csv")
    test = pd.read_csv(data / "Hourly-test.csv")
    out = []
    for (_, tr), (_, te) in zip(train.iterrows(), test.iterrows()):
        sid = tr.iloc[0]
        y = tr.iloc[1:].dropna().to_numpy(dtype=float)
        f = te.iloc[1:].dropna().to_numpy(dtype=float)[:HORIZON]
        out.append((sid, y, f))
    return out


def _cpu() -> float:
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime


def _score(y: np.ndarray, f: np.ndarray, frame: pd.DataFrame) -> tuple[float, float]:
    scale = np.mean(np.abs(y[SEASON:] - y[:-SEASON]))
    yhat = frame["yhat"].to_numpy()
    mase = float(np.mean(np.abs(f - yhat)) / scale) if scale > 0 else float("nan")
    inside = (f >= frame["yhat_lower"].to_numpy()) & (f <= frame["yhat_upper"].to_numpy())
    return mase, float(np.mean(inside))


def _as_series(y: np.ndarray) -> pd.Series:
    return pd.Series(y, index=pd.date_range("2000-01-03", periods=len(y), freq="h"))


def run_one(args: tuple) -> dict:
    """Score the methods on one series (runs in a worker process)."""
    sid, y, f, methods, seasonal, auto_kw = args
    series = _as_series(y)
    row: dict = {"id": sid}
    for method in methods:
        t0 = _cpu()
        if method == "auto":
            model = AutoForecaster(horizon=HORIZON, level=LEVEL, season=SEASON, **auto_kw).fit(series)
            frame = model.predict(HORIZON)
            row["auto_model"] = model.summary_.get("model")
        elif method == "arima":
            model = ArimaForecaster(level=LEVEL, season=SEASON, seasonal=seasonal).fit(series)
            frame = model.predict(HORIZON)
            row["arima_fallback"] = model.summary_.get("fallback")
            row["arima_order"] = (model.summary_.get("p"), model.summary_.get("d"), model.summary_.get("q"),
                                  model.summary_.get("D"), model.summary_.get("Q"))
        elif method == "snaive":
            frame = SeasonalNaiveForecaster(SEASON, LEVEL).fit(series).predict(HORIZON)
        elif method == "prophet":
            frame = _prophet(series)
        else:
            raise ValueError(method)
        cpu = _cpu() - t0
        mase, cover = _score(y, f, frame)
        row[f"{method}_mase"], row[f"{method}_cover"], row[f"{method}_cpu"] = mase, cover, cpu
        row[f"{method}_nan"] = bool(frame[["yhat", "yhat_lower", "yhat_upper"]].isna().any().any())
    return row


def cli_cpu(series: list, calls: int) -> list[float]:
    """CPU-s (user + sys, process start included) of real ``gpupool forecast`` calls on the
    ``calls`` longest series."""
    out = []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "include")}
    longest = sorted(series, key=lambda t: -len(t[1]))[:calls]
    with tempfile.TemporaryDirectory() as tmp:
        for sid, y, _ in longest:
            s = _as_series(y)
            src = Path(tmp) / f"{sid}.csv"
            pd.DataFrame({"time": s.index.strftime("%Y-%m-%d %H:%M:%S"), "y": y}).to_csv(src, index=False)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", "import sys; from gpupool.cli import main; sys.exit(main())",
                            "forecast", str(src), "--horizon", str(HORIZON), "--season", str(SEASON), "--level",
                            str(LEVEL), "--out", str(Path(tmp) / "out.csv")], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            out.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return out


def _prophet(series: pd.Series) -> pd.DataFrame:
    from prophet import Prophet

    for name in ("cmdstanpy", "prophet"):  # after the import, which installs their handlers
        logging.getLogger(name).setLevel(logging.ERROR)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = Prophet(interval_width=LEVEL / 100, daily_seasonality=True, weekly_seasonality=True,
                    yearly_seasonality=False)
        m.fit(pd.DataFrame({"ds": series.index, "y": series.to_numpy()}))
        future = pd.DataFrame({"ds": pd.date_range(series.index[-1] + pd.Timedelta(hours=1), periods=HORIZON,
                                                   freq="h")})
        fc = m.predict(future)
    return pd.DataFrame({"ts": fc["ds"], "yhat": fc["yhat"], "yhat_lower": fc["yhat_lower"],
                         "yhat_upper": fc["yhat_upper"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=None, help="first N series only")
    parser.add_argument("--stride", type=int, default=1, help="every S-th series (a spread-out subset)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--prophet", type=int, default=414,
                        help="Prophet on this many evenly spaced series (default all; 0 skips it)")
    parser.add_argument("--seasonal", default="auto", choices=["auto", "fourier", "diff"],
                        help="ArimaForecaster(seasonal=...) for an ablation; the product uses auto")
    parser.add_argument("--methods", default="auto,arima,snaive",
                        help="comma-separated methods to score (auto, arima, snaive; prophet via --prophet)")
    parser.add_argument("--auto", default="{}", help="AutoForecaster keyword arguments as a Python dict, for ablations")
    parser.add_argument("--cli", type=int, default=4,
                        help="real `gpupool forecast` calls, on the longest series, to time (0 skips)")
    parser.add_argument("--csv", type=Path, default=None, help="write per-series rows here")
    ns = parser.parse_args(argv)

    series = load(ns.data.resolve())[:: ns.stride]
    if ns.limit:
        series = series[: ns.limit]
    n = len(series)
    prophet_idx = set(np.linspace(0, n - 1, min(ns.prophet, n)).round().astype(int).tolist()) if ns.prophet else set()
    tasks = [
        (sid, y, f, ns.methods.split(",") + (["prophet"] if i in prophet_idx else []), ns.seasonal,
         ast.literal_eval(ns.auto))
        for i, (sid, y, f) in enumerate(series)
    ]
    wall = time.perf_counter()
    if ns.jobs > 1:
        with ProcessPoolExecutor(ns.jobs) as pool:
            rows = list(pool.map(run_one, tasks, chunksize=1))
    else:
        rows = [run_one(t) for t in tasks]
    wall = time.perf_counter() - wall
    df = pd.DataFrame(rows)
    if ns.csv:
        df.to_csv(ns.csv, index=False)

    def figures(frame: pd.DataFrame, method: str) -> str:
        return (f"MASE {frame[f'{method}_mase'].mean():6.3f}  coverage {100 * frame[f'{method}_cover'].mean():5.1f}%"
                f"  CPU {frame[f'{method}_cpu'].mean():6.3f} s/series  NaN rows {int(frame[f'{method}_nan'].sum())}")

    print(f"M4 Hourly, {n} series, h={HORIZON}, MASE scaled by seasonal naive m={SEASON}, {LEVEL}% intervals, "
          f"wall {wall:.0f} s with {ns.jobs} job(s)")
    for method, name in (("auto", "auto"), ("arima", "arima"), ("snaive", "seasonal naive")):
        if f"{method}_mase" in df:
            print(f"  {name:14s} {figures(df, method)}")
    if prophet_idx:
        sub = df[df["prophet_mase"].notna()]
        print(f"  on the {len(sub)} series Prophet ran on:")
        for method, name in (("auto", "auto"), ("arima", "arima"), ("snaive", "seasonal naive"), ("prophet", "prophet")):
            print(f"    {name:14s} {figures(sub, method)}")
    if "arima_fallback" in df and "snaive_mase" in df:
        print(f"  arima fallbacks: {df['arima_fallback'].notna().sum()}; MASE ratio arima / seasonal naive: "
              f"{df['arima_mase'].mean() / df['snaive_mase'].mean():.3f}")
    print("  auto's choices: " + ", ".join(f"{k} {v}" for k, v in df["auto_model"].value_counts().items()))
    cli = cli_cpu(series, ns.cli) if ns.cli else []
    if cli:
        print(f"  CPU per `gpupool forecast` call on the {len(cli)} longest series, process start included: "
              f"mean {np.mean(cli):.2f} s, max {np.max(cli):.2f} s")
    ok_mase = df["auto_mase"].mean() <= 0.92
    ok_cover = 0.85 <= df["auto_cover"].mean() <= 0.95
    ok_cpu = df["auto_cpu"].mean() <= 3.0 and (max(cli) <= 3.0 if cli else True)
    ok_nan = not df["auto_nan"].any()
    print(f"  bars (auto): MASE<=0.92 {'PASS' if ok_mase else 'FAIL'}, coverage in [85,95]% "
          f"{'PASS' if ok_cover else 'FAIL'}, no NaN {'PASS' if ok_nan else 'FAIL'}, CPU<=3 s {'PASS' if ok_cpu else 'FAIL'}")
    return 0 if (ok_mase and ok_cover and ok_cpu and ok_nan) else 1


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run("forecast_m4", main))
