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


def test_main_writes_and_checks_the_page(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 1
    assert "out of date: run python -m gpupool.config_doc" in capsys.readouterr().err
    assert config_doc.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / config_doc.DOC_PATH).read_text() == config_doc.render()
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / config_doc.DOC_PATH).write_text("stale\n")
    assert config_doc.main(["--root", str(tmp_path), "--check"]) == 1


def test_main_without_a_docs_folder_says_so(tmp_path, capsys):
    assert config_doc.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err
