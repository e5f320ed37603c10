"""The configuration reference (docs/configuration.md), rendered from the pydantic models.

Every key of platforms.yaml is a field of :class:`gpupool.config.GpupoolConfig` or of a model
nested in it; this module walks them and writes one table per section: key, type (with its
bounds), default and the field's ``description``. A field without a description is refused, so a
new key cannot go undocumented; tests/unit/core/test_config_doc.py fails while the checked-in
page differs from what this renders.

    python -m gpupool.config_doc            # rewrite docs/configuration.md
    python -m gpupool.config_doc --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: the page this module writes, relative to the repository root
DOC_PATH = Path("docs") / "configuration.md"
REGENERATE = "python -m gpupool.config_doc"

INTRO = """\
# Configuration reference

<!-- Generated from include/gpupool/config.py by `{regenerate}`; do not edit by hand
     (tests/unit/core/test_config_doc.py fails while this page differs from the models). -->

gpupool reads one YAML file, `platforms.yaml`: point `GPUPOOL_CONFIG` at it. Without it gpupool
runs on the embedded virtual datacenter (platforms `openstack`, `slurm` and `kubernetes` of kind
`simulator`). `config/platforms.example.yaml` is an annotated example. Connections (URLs,
credentials) are never in this file: each platform names an Airflow connection
([docs/operations/real-platforms.md](operations/real-platforms.md)).

A bad file fails with one message naming the file, the key and the reason, e.g.
`platforms.yaml: key 'platforms[hpc].kind': Input should be 'openstack', 'slurm', 'kubernetes' or
'simulator'`. An unknown key is refused, not ignored, in every section. Booleans are YAML
booleans only: a string such as `"off"` is refused, not guessed.
"""


def _links() -> dict[tuple[str, str], type[BaseModel]]:
    """Sections whose YAML is a plain mapping checked against another model by a validator:
    (section, key) -> that model, documented as a section of its own."""
    from gpupool.detect.router import RouterConfig

    return {("detect", "router"): RouterConfig}


def _text(s: str | None) -> str:
    """One Markdown line: Sphinx roles as code, whitespace collapsed, pipes escaped."""
    s = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", s or "")
    s = re.sub(r"``([^`]+)``", r"`\1`", s)
    return " ".join(s.split()).replace("|", "\\|")


def _type_name(tp: Any, inner: bool = False) -> str:
    """``tp`` in words; ``inner``: inside a list or mapping, where a union is parenthesised."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a, True) for a in args if a is not type(None)]
        if len(names) < len(args):
            names.append("null")
        text = ", ".join(names[:-1]) + (", or " if len(names) > 2 else " or ") + names[-1]
        return f"({text})" if inner else text
    if origin is list or tp is list:
        return f"list of {_type_name(args[0], True)}" if args else "list"
    if origin is dict or tp is dict:
        return f"mapping of {_type_name(args[0], True)} to {_type_name(args[1], True)}" if args else "mapping"
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}.get(tp, getattr(tp, "__name__", str(tp)))


def _bounds(field: FieldInfo) -> list[str]:
    out = []
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            out.append(f"≥ {m.ge}")
        elif isinstance(m, annotated_types.Gt):
            out.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Le):
            out.append(f"≤ {m.le}")
        elif isinstance(m, annotated_types.Lt):
            out.append(f"< {m.lt}")
        elif isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {m.max_length} characters")
        elif getattr(m, "pattern", None):
            out.append(f"matching `{m.pattern}`")
    return out


def _yaml(value: Any) -> str:
    if value == "":
        return '`""`'
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return f"`{text.removesuffix('...').strip()}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _yaml(field.default_factory())
    if field.default is PydanticUndefined:
        return "required"
    return _yaml(field.default)


def _nested(tp: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds, and whether it holds a list of them."""
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return tp, False
    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp) or (None,)
        if inspect.isclass(arg) and issubclass(arg, BaseModel):
            return arg, True
    return None, False


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9_ -]", "", path.lower()).replace(" ", "-")


def _section(path: str, model: type[BaseModel], expand: bool, links, out: list[str]) -> None:
    """Append the section for ``model`` at ``path`` and, after it, its nested sections.

    ``expand`` False: fields holding other models are rows of this table, not sections (the
    detector's benchmark-chosen rules, set only to tune).
    """
    later: list[tuple[str, type[BaseModel], bool]] = []
    title = path or "top level"
    out += ["", f"## `{title}`" if path else "## Top level", ""]
    doc = _text(inspect.cleandoc(model.__doc__)) if model.__doc__ and model.__doc__ is not BaseModel.__doc__ else ""
    if doc:
        out += [doc, ""]
    out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        if not field.description:
            raise ValueError(f"{model.__module__}.{model.__name__}.{name} (`{key}`) has no description")
        sub, many = _nested(field.annotation)
        linked = links.get((path, name))
        kind = ", ".join([_type_name(field.annotation)] + _bounds(field))
        if sub is not None and expand:
            child = f"{key}[]" if many else key
            later.append((child, sub, True))
            see = f"[`{child}`](#{_anchor(child)})"
            kind = f"list of {see} entries" if many else f"mapping: {see}"
            default = _default(field) if many else "its keys' defaults"
        elif sub is not None:
            # a model set only to tune (the detector's benchmark-chosen rules): named, not expanded
            default = f"`{sub.__module__}.{sub.__qualname__}()`"
        elif linked is not None:
            later.append((key, linked, False))
            kind = f"mapping: [`{key}`](#{_anchor(key)})"
            default = _default(field)
        else:
            default = _default(field)
        out.append(f"| `{name}` | {kind} | {default} | {_text(field.description)} |")
    for child, sub, exp in later:
        _section(child, sub, exp, links, out)


def render(model: type[BaseModel] | None = None) -> str:
    """The reference page for ``model`` (default: the whole of platforms.yaml) as Markdown."""
    if model is None:
        from gpupool.config import GpupoolConfig

        model = GpupoolConfig
    links = _links() if model.__module__ == "gpupool.config" else {}
    out = [INTRO.format(regenerate=REGENERATE).rstrip()]
    _section("", model, True, links, out)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or, with ``--check``, compare) docs/configuration.md under ``--root``."""
    parser = argparse.ArgumentParser(prog="python -m gpupool.config_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs, write nothing")
    args = parser.parse_args(argv)
    path = args.root / DOC_PATH
    text = render()
    if args.check:
        same = path.is_file() and path.read_text() == text
        if not same:
            print(f"{path} is out of date: run {REGENERATE}", file=sys.stderr)
        return 0 if same else 1
    if not path.parent.is_dir():
        print(f"{path.parent}: no such folder (run from the repository root or pass --root)", file=sys.stderr)
        return 2
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
