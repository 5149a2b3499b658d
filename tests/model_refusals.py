"""A model description resealed into a real container, so both validators judge the same bytes:
Python's (format/model_desc.py) and the engine's at open (runtime/src/model_config.c)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from moepack.format.model_desc import ModelDescError, validate_model
from moepack.runtime.engine import EngineError, plan
from spec_vectors import VECTORS, load_generator

BASE = VECTORS / "valid" / "mixtral2.moepack"
_gen = load_generator()


def json_floats(obj: Any) -> list[float]:
    """Every float in a JSON-shaped value."""
    if isinstance(obj, dict):
        return [f for v in obj.values() for f in json_floats(v)]
    if isinstance(obj, list):
        return [f for v in obj for f in json_floats(v)]
    return [obj] if isinstance(obj, float) else []


def reseal_model(tmp_path: Path, model: dict, config: dict) -> Path:
    """BASE with manifest.model and manifest.source.config replaced (container ID matching);
    a non-finite number goes in as JSON's NaN / Infinity tokens, which no reader accepts."""
    data = BASE.read_bytes()
    doc = _gen.index_doc(data)
    doc["manifest"]["model"], doc["manifest"]["source"]["config"] = model, config
    finite = all(math.isfinite(v) for v in json_floats(model))
    raw = None if finite else json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    path = tmp_path / "bad.moepack"
    path.write_bytes(_gen.reseal(data, raw if raw is not None else doc))
    return path


def c_refusal(path: Path) -> str:
    """The engine's refusal of the container at open."""
    with pytest.raises(EngineError) as e:
        plan(str(path))
    return str(e.value)


def assert_refused_by_both(tmp_path: Path, model: dict, config: dict,
                           change: dict[str, Any], field: str) -> None:
    """`model` with `change` ("leaf" or "object.leaf": value) applied is refused by both
    validators: Python names `field`, the engine its name without an element index."""
    model = json.loads(json.dumps(model))
    for key, value in change.items():
        obj, _, leaf = key.rpartition(".")
        (model[obj] if obj else model)[leaf] = value
    with pytest.raises(ModelDescError) as d:
        validate_model(model)
    assert d.value.field == field
    msg = c_refusal(reseal_model(tmp_path, model, config))
    assert "manifest.model: " in msg and field.split("[")[0] in msg, msg
