"""Comparing the shape of a facade's JSON answer with a real service's recorded one."""

from __future__ import annotations

from typing import Any

#: JSON types that may stand for each other (a count is an int in one answer, a float in another)
_NUMBER = (int, float)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, _NUMBER):
        return "number"
    return type(v).__name__


def shape_diff(real: Any, fake: Any, path: str = "$", open_maps: tuple[str, ...] = (),
               nullable: tuple[str, ...] = ()) -> list[str]:
    """Differences of keys and value types between ``real`` and ``fake``.

    ``open_maps``: paths (with ``[]`` for list items, ``*`` for any key) of dicts whose keys are
    data (labels, resource classes): only their value types are compared. ``nullable``: paths
    where either side may be null. Lists are compared item-by-item against the real first item.
    """
    out: list[str] = []
    if path in nullable and (real is None or fake is None):
        return out
    if _kind(real) != _kind(fake):
        return [f"{path}: real {_kind(real)}, facade {_kind(fake)}"]
    if isinstance(real, dict):
        if any(_match(path, p) for p in open_maps):
            sample = next(iter(real.values()), None)
            for k, v in fake.items():
                if sample is not None:
                    out += shape_diff(sample, v, f"{path}.*", open_maps, nullable)
            return out
        missing, extra = set(real) - set(fake), set(fake) - set(real)
        if missing:
            out.append(f"{path}: facade lacks {sorted(missing)}")
        if extra:
            out.append(f"{path}: facade adds {sorted(extra)}")
        for k in set(real) & set(fake):
            out += shape_diff(real[k], fake[k], f"{path}.{k}", open_maps, nullable)
    elif isinstance(real, list) and real and fake:
        if len({_kind(x) for x in real}) > 1:  # a tuple such as [timestamp, "value"]: by position
            if len(real) != len(fake):
                return [f"{path}: real has {len(real)} items, facade {len(fake)}"]
            for i, (a, b) in enumerate(zip(real, fake)):
                out += shape_diff(a, b, f"{path}[{i}]", open_maps, nullable)
            return out
        for item in fake:
            out += shape_diff(real[0], item, f"{path}[]", open_maps, nullable)
    return out


def _match(path: str, pattern: str) -> bool:
    a, b = path.split("."), pattern.split(".")
    return len(a) == len(b) and all(y == "*" or x == y for x, y in zip(a, b))
