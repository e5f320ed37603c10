"""No module of the package is over 700 lines: a longer one is split where it has two concerns
(as the Kubernetes facade's app and its objects are)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "include" / "gpupool"
MAX_LINES = 700


def test_no_module_is_over_700_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50  # the package itself, not an empty folder
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
