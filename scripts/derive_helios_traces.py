"""Derive the compact Helios traces the shipped what-if scenario replays.

    .venv/bin/python scripts/derive_helios_traces.py [--source ../shared/data/helios] [--check]

Reads the six per-minute Helios virtual-cluster traces (SenseTime "Earth" cluster, May 2020,
MIT licence, https://github.com/S-Lab-System-Group/HeliosData) and writes, for each, the
5-minute means of the columns the simulator uses (`running_gpu_num`, `pending_gpu_num`,
`total_gpu_num`, `gpu_utilization`) as a gzip CSV in the same format under
`config/scenarios/data/helios/`, beside a copy of the licence. The averaging is the trace
reader's own (`gpupool.sim.traces.read_helios` at a 5-minute step), so a scenario with
`step: 5min` reads the same demand from the derived files as from the originals.
`--check` compares the files on disk with a fresh derivation instead of writing them.
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

from gpupool.sim.traces import read_helios  # noqa: E402

CLUSTERS = ("vc6YE", "vcMod", "vcLJZ", "vcSoL", "vchbv", "vcpDC")
STEP = "5min"
OUT = ROOT / "config" / "scenarios" / "data" / "helios"


def derive(source: Path, cluster: str) -> bytes:
    """The gzip CSV bytes for one cluster (deterministic: no timestamp in the gzip header)."""
    frame = read_helios(source / f"{cluster}.csv", step=STEP)
    out = frame[["running", "pending", "total", "util"]].rename(
        columns={
            "running": "running_gpu_num",
            "pending": "pending_gpu_num",
            "total": "total_gpu_num",
            "util": "gpu_utilization",
        }
    )
    out.index = out.index.tz_convert("UTC").tz_localize(None).strftime("%Y-%m-%d %H:%M:%S")
    out.index.name = "time"
    text = out.to_csv(float_format="%.10g", lineterminator="\n")
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(text.encode("ascii"))
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "data" / "helios")
    ap.add_argument("--check", action="store_true", help="verify the shipped files instead of writing them")
    args = ap.parse_args(argv)
    if not (args.source / "LICENSE.txt").is_file():
        print(f"error: {args.source}: no Helios traces (LICENSE.txt missing)", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for cluster in CLUSTERS:
        target = OUT / f"{cluster}.csv.gz"
        data = derive(args.source, cluster)
        if args.check:
            original = read_helios(args.source / f"{cluster}.csv", step=STEP)
            shipped = read_helios(target, step=STEP)
            worst = float(np.abs(original.to_numpy() - shipped.to_numpy()).max()) if original.index.equals(shipped.index) else np.inf
            same = target.is_file() and target.read_bytes() == data
            print(f"{cluster}: {len(shipped)} steps, max |shipped - original| {worst:.2e}, bytes {'identical' if same else 'DIFFER'}")
            if not same or worst > 1e-6:
                stale.append(cluster)
        else:
            target.write_bytes(data)
            print(f"{target.relative_to(ROOT)}: {len(data)} bytes")
    if not args.check:
        shutil.copyfile(args.source / "LICENSE.txt", OUT / "LICENSE.txt")
    if stale:
        print(f"error: shipped traces differ from a fresh derivation: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
