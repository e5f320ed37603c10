"""The README stays a reference; every relative link of the docs leads somewhere, and every
``gpupool.*`` name they give exists."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: the README is read in one sitting: what gpupool is, the two commands, layout, configuration,
#: CLI, DAGs, real platforms, actuation rules, links; the rest lives under docs/
README_MAX_LINES = 400
#: ``[text](target)`` and ``![alt](target)``, target without spaces, optional "title"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
PKG = ROOT / "include"
#: ``gpupool.<name>`` in the docs that is no Python name: the Kubernetes label domain, the dashboard
NOT_PYTHON = {"gpupool.io", "gpupool.json"}


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that name a file of the repository (not a URL, not
    an anchor of the page itself), outside code spans and blocks."""
    out = []
    for target in LINK.findall(CODE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_readme_is_at_most_400_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to a page under docs/ and link it")


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for page in _pages():
        for target in relative_links(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.exists() or ROOT.resolve() not in (path, *path.parents):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_link_reader_finds_links_and_skips_urls_anchors_and_code():
    text = ("see [a](docs/a.md#part), ![img](pic.png \"t\") and [web](https://x.org/y.md), "
            "[here](#top), `[not](code.md)`\n```\n[nor](block.md)\n```\n[last](../b/c.md)")
    assert relative_links(text) == ["docs/a.md", "pic.png", "../b/c.md"]


def test_every_docs_page_is_reachable_from_the_readme():
    """A page nobody links is a page nobody reads: each page under docs/ is linked from the
    README or from a page the README reaches."""
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        todo += [(page.parent / t).resolve() for t in relative_links(page.read_text())]
    orphans = sorted(str(p.relative_to(ROOT)) for p in _pages() if p.resolve() not in {s.resolve() for s in seen})
    assert orphans == []


@lru_cache(maxsize=None)
def _top_level_names(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def resolves(dotted: str, root: Path = PKG) -> bool:
    """Whether ``gpupool.a.b.c`` names a module of the package, or a top-level name of one (what
    follows that name, a method or a field, is not checked)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return i == len(parts) or parts[i] in _top_level_names(module)
    return False


def test_every_gpupool_name_in_the_readme_and_docs_exists():
    """A name that moved or was renamed is stale wherever the docs still give it."""
    stale = []
    for page in _pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for name in re.findall(r"\bgpupool(?:\.[A-Za-z_]\w*)+", line):
                if name not in NOT_PYTHON and not resolves(name):
                    stale.append(f"{page.relative_to(ROOT)}:{n}: {name}")
    assert stale == []


def test_the_name_check_sees_modules_names_and_their_absence(tmp_path):
    pkg = tmp_path / "gpupool"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("X = 1\ndef f():\n    Y = 2\nclass C:\n    z = 3\n")
    assert resolves("gpupool.sub.mod", tmp_path) and resolves("gpupool.sub.mod.X", tmp_path)
    assert resolves("gpupool.sub.mod.C.z", tmp_path)
    assert not resolves("gpupool.sub.mod.Y", tmp_path)  # local to f
    assert not resolves("gpupool.sub.gone", tmp_path) and not resolves("gpupool.other.mod", tmp_path)
