"""docs/configuration.md is generated from the pydantic models: a new key cannot go undocumented."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from gpupool import config_doc
from gpupool.config import GpupoolConfig

ROOT = Path(__file__).resolve().parents[3]


def test_the_checked_in_reference_is_what_the_models_render():
    page = ROOT / config_doc.DOC_PATH
    assert page.read_text() == config_doc.render(), (
        f"{config_doc.DOC_PATH} differs from the models in include/gpupool/config.py: regenerate it with "
        f"`PYTHONPATH=include .venv/bin/{config_doc.REGENERATE}` from the repository root")


def _keys(model: type[BaseModel], path: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        out.add(key)
        sub, many = config_doc._nested(field.annotation)
        if sub is not None:
            out |= _keys(sub, f"{key}[]" if many else key)
    return out


def test_every_key_of_the_file_has_a_row_in_its_section():
    text = config_doc.render()
    sections = {}
    for block in text.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip("`") if title != "Top level" else ""] = body
    for key in _keys(GpupoolConfig):
        section, _, name = key.rpartition(".")
        assert section in sections, f"no section for {section!r} (key {key})"
        assert f"\n| `{name}` |" in sections[section], f"{key} has no row in section {section!r}"
    router = sections["detect.router"]
    assert "\n| `tau_multiplier` |" in router and "\n| `overrides` |" in router


def test_a_field_without_a_description_is_refused():
    class Inner(BaseModel):
        """An inner section."""

        bare: int = 3

    class Outer(BaseModel):
        """A file."""

        mode: Literal["a", "b"] = Field("a", description="which")
        inner: Inner = Field(default_factory=Inner, description="nested")

    with pytest.raises(ValueError, match=r"Inner\.bare \(`inner\.bare`\) has no description"):
        config_doc.render(Outer)


def test_types_bounds_and_defaults_are_rendered():
    class Section(BaseModel):
        """Doc with ``code`` and a :class:`~x.Y` role."""

        n: int | None = Field(None, ge=1, description="a | pipe")
        m: dict[str, str | dict[str, str] | None] = Field(default_factory=dict, description="mapping")
        s: str = Field("", description="empty")

    text = config_doc.render(Section)
    assert "Doc with `code` and a `x.Y` role." in text
    assert "| `n` | integer or null, ≥ 1 | `null` | a \\| pipe |" in text
    assert "| `m` | mapping of string to (string, mapping of string to string, or null) | `{}` | mapping |" in text
    assert '| `s` | string | `""` | empty |' in text


def test_the_readme_table_of_sections_is_what_the_models_render():
    readme = (ROOT / config_doc.README_PATH).read_text()
    assert readme == config_doc.with_sections(readme), (
        f"README.md's table of configuration sections differs from the models: regenerate it with "
        f"`PYTHONPATH=include .venv/bin/{config_doc.REGENERATE}` from the repository root")
    table = config_doc.render_sections()
    for name in GpupoolConfig.model_fields:
        assert f"| [`{name}`](docs/configuration.md#" in table


def _tree(tmp_path, readme: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)


def test_main_writes_and_checks_both_texts(tmp_path, capsys):
    _tree(tmp_path, f"# x\n\nbefore\n{config_doc.BEGIN}\nold table\n{config_doc.END}\nafter\n")
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "configuration.md" in err and "README.md" in err and "run python -m gpupool.config_doc" in err
    assert config_doc.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / config_doc.DOC_PATH).read_text() == config_doc.render()
    readme = (tmp_path / "README.md").read_text()
    assert readme == (f"# x\n\nbefore\n{config_doc.BEGIN}\n{config_doc.render_sections()}{config_doc.END}\nafter\n")
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / config_doc.DOC_PATH).write_text("stale\n")
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 1


def test_a_readme_without_the_markers_is_one_line_and_exit_2(tmp_path, capsys):
    _tree(tmp_path, f"# x\n{config_doc.END}\n{config_doc.BEGIN}\n")
    assert config_doc.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing or out of order" in err
    assert not (tmp_path / config_doc.DOC_PATH).exists()


def test_main_outside_the_repository_says_so(tmp_path, capsys):
    assert config_doc.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run from the repository root" in err
