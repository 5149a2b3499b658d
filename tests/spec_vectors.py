"""The spec's test vectors (spec/vectors): the committed files and their generator, for the tests
that read them (the vectors' own tests: tests/test_vectors.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
VALID = sorted((VECTORS / "valid").glob("*.moepack"))
INVALID = sorted((VECTORS / "invalid").glob("*.moepack"))


def load_generator() -> ModuleType:
    """spec/vectors/make_vectors.py as module `make_vectors` (loaded once per process)."""
    if "make_vectors" in sys.modules:
        return sys.modules["make_vectors"]
    spec = importlib.util.spec_from_file_location("make_vectors", VECTORS / "make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_vectors"] = module
    spec.loader.exec_module(module)
    return module
