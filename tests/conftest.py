"""Command-line options for tests that need something outside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--llama-cpp", type=Path, default=None, metavar="DIR",
                     help="llama.cpp sources (e.g. llama-cpp-python's vendor/llama.cpp) for the "
                          "tests that run its converter; skipped without it")


@pytest.fixture(scope="session")
def llama_cpp_dir(request: pytest.FixtureRequest) -> Path:
    """The --llama-cpp directory; the test is skipped when it is not given."""
    path = request.config.getoption("--llama-cpp")
    if path is None:
        pytest.skip("needs --llama-cpp DIR (llama.cpp sources)")
    return path.resolve()
