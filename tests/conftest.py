"""Command-line options for tests that need something outside the repository, and the demo
server fixtures the serve tests share."""

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


@pytest.fixture(scope="module")
def srv():
    """The shared demo server (tests/serve_fixtures.py) for the serve tests that ask for it."""
    from serve_fixtures import demo_server

    return demo_server()


@pytest.fixture(scope="module")
def client(srv):
    """An openai client of the demo server: the official client, no retries."""
    import openai

    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
