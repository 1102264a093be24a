"""docs/config.md lists every config key with its default: walked from the pydantic models, so a key
added, renamed or given another default without the reference following fails here."""

from __future__ import annotations

import re
import typing
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from deltadrain.config import DeltadrainConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _models(annotation) -> list[tuple[type[BaseModel], bool]]:
    """(model, is a list of it) for each model an annotation holds (unions, Annotated, lists)."""
    if typing.get_origin(annotation) is list:
        return [(m, True) for m, _ in _models(typing.get_args(annotation)[0])]
    found = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            found.append((arg, False))
        elif typing.get_origin(arg) is list and typing.get_args(arg):
            found += [(m, True) for m, _ in _models(typing.get_args(arg)[0])]
        elif typing.get_args(arg):
            found += _models(arg)
    return found


def config_keys(model: type[BaseModel] = DeltadrainConfig, prefix: str = "") -> dict[str, object]:
    """Every YAML key as the reference writes it (a pipeline's keys without `pipelines[].`) -> default."""
    keys = {}
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}{field.alias or name}"
        subs = _models(field.annotation)
        if not subs or subs[0][1]:  # a section (source:, airflow:) is a heading, a list of models a key
            keys[key] = field.get_default() if not field.is_required() else None
        for sub, is_list in subs:
            inner = f"{key}[]." if is_list else f"{key}."
            keys.update(config_keys(sub, "" if inner == "pipelines[]." else inner))
    return keys


def shown(default) -> str | None:
    """How the reference writes a default, for the kinds it can be checked on."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, int | str):
        return str(default)
    if isinstance(default, timedelta):
        seconds = int(default.total_seconds())
        if seconds % 86400 == 0:
            return f"P{seconds // 86400}D"
        return f"PT{seconds // 60}M" if seconds % 60 == 0 else f"PT{seconds}S"
    return None


def test_every_config_key_is_in_the_reference_with_its_default():
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| ([^|]*) \|", DOC.read_text(), re.M)}
    keys = config_keys()
    assert "source.maxlen" in keys and "quality.expectations[].within" in keys and "schema.id_field" in keys
    missing = sorted(set(keys) - set(rows))
    assert not missing, f"docs/config.md lacks {missing}"
    wrong = {k: (rows[k], shown(d)) for k, d in keys.items() if shown(d) is not None and f"`{shown(d)}`" not in rows[k]}
    assert not wrong, f"docs/config.md shows other defaults (doc, code): {wrong}"
    unknown = sorted(k for k in rows if k not in {*keys, "services", "maintenance"}
                     and not k.startswith(("DELTADRAIN", "AIRFLOW")))
    assert not unknown, f"docs/config.md lists keys the config does not have: {unknown}"
