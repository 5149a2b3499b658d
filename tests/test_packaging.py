"""The package as users get it: declared dependencies match the imports, and a wheel built from
this tree installs into a fresh virtual environment without torch and runs the demo.

`test_declared_dependencies_are_the_imports` reads the sources (fast). The wheel test builds an
sdist and a wheel (`python -m build`, the C engine compiled by setup.py), installs the wheel with
its base dependencies from the package index into a new venv and runs `moepack --version`,
`convert`, `verify` and `run` there (slow: ~40 s with a warm pip cache; more when pip must
download the dependencies). A second venv gets the same wheel with the base dependencies at
their declared minimum versions and runs the CLI there (~15 s more).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

import moepack

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]


# Base dependencies that no module imports, each used at run time by another dependency.
USED_THROUGH = {
    "uvloop": "uvicorn's event loop when installed (serve)",
    "httptools": "uvicorn's HTTP parser when installed (serve)",
}


def _dist_name(requirement: str) -> str:
    """'huggingface_hub>=2.0' -> 'huggingface-hub' (PEP 503 normalised)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def _package_sources() -> list[Path]:
    """Every .py file the wheel installs (the package-dir folders, not tests/bench/demo)."""
    files = []
    for package in SETUPTOOLS["packages"]:
        parent, _, leaf = package.rpartition(".")
        folder = (ROOT / PACKAGE_DIRS[package] if package in PACKAGE_DIRS
                  else ROOT / PACKAGE_DIRS[parent] / leaf)
        files += sorted(folder.glob("*.py"))
    return files


def _imports(files: list[Path]) -> dict[str, bool]:
    """Top-level name of every absolute import -> True when only imported inside functions
    (lazily: an optional feature may need an extra), False when some module imports it."""
    names: dict[str, bool] = {}

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            top = None
            if isinstance(child, ast.Import):
                top = {a.name.split(".")[0] for a in child.names}
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                top = {child.module.split(".")[0]}
            for name in top or ():
                names[name] = names.get(name, True) and lazy
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for f in files:
        visit(ast.parse(f.read_text(), str(f)), False)
    for name in (*sys.stdlib_module_names, "moepack", "__future__"):
        names.pop(name, None)
    return names


def _extras() -> set[str]:
    return {_dist_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values()
            for r in reqs}


def test_every_package_folder_is_listed():
    """A folder with Python files under a package-dir that is not in `packages` would be left
    out of the wheel (setuptools only warns)."""
    listed = set(SETUPTOOLS["packages"])
    for package, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("*.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts or init.parent.name == "tests_c":
                continue
            name = ".".join((package, *rel.parts))
            assert name in listed, f"{init.relative_to(ROOT)}: package {name} is not listed"


def test_declared_dependencies_are_the_imports():
    """Base dependencies = the distributions that the installed packages import, both ways; a
    distribution from an extra only where it is imported lazily (convert --ray: ray)."""
    imports = _imports(_package_sources())
    providers = importlib.metadata.packages_distributions()
    declared = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    needed = {}
    for top, lazy in sorted(imports.items()):
        assert top in providers, f"{top!r} is imported but no installed distribution provides it"
        dists = needed[top] = {_dist_name(d) for d in providers[top]}
        allowed = declared | _extras() if lazy else declared
        assert dists & allowed, f"{top!r} ({sorted(dists)}) is imported but not declared" + (
            "" if lazy else " as a base dependency (imported at module level)")
    provided = set().union(*needed.values()) | set(USED_THROUGH)
    assert declared <= provided, f"declared but never imported: {sorted(declared - provided)}"
    reference = {_dist_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["reference"]}
    for heavy in ("torch", "transformers", "safetensors"):
        assert heavy not in declared and heavy in reference


def test_version_defined_once():
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "moepack.__version__"}
    assert importlib.metadata.version("moepack") == moepack.__version__
    out = subprocess.run([sys.executable, "-m", "moepack", "--version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout == f"moepack {moepack.__version__}\n"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _sh(*args, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the tests below."""
    env = _clean_env()
    tmp_path = tmp_path_factory.mktemp("build")
    # Build from a copy of what the wheel is made of, so that the build leaves nothing in the
    # tree; sdist first, then the wheel from the sdist (proves the sdist is complete).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    junk = shutil.ignore_patterns("__pycache__", "build", "*.so", "*.o", "*.egg-info")
    for folder in sorted(set(PACKAGE_DIRS.values())):
        shutil.copytree(ROOT / folder, src / folder, ignore=junk)
    dist = tmp_path / "dist"
    _sh(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src,
        cwd=tmp_path, env=env)
    (built,) = dist.glob("moepack-*.whl")
    return built


@pytest.mark.slow
def test_wheel_installs_without_torch_and_runs_the_demo(tmp_path: Path, wheel: Path) -> None:
    env = _clean_env()
    assert wheel.name.startswith(f"moepack-{moepack.__version__}-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert [n for n in names if re.fullmatch(r"moepack/runtime/_engine[^/]*\.so", n)], names
    assert [n for n in names if re.fullmatch(r"moepack/convert/_encoder[^/]*\.so", n)], names
    assert "moepack/serve/static/index.html" in names
    assert f"moepack-{moepack.__version__}.dist-info/licenses/LICENSE" in names  # Apache-2.0 s. 4
    assert not [n for n in names if n.endswith((".c", ".h"))], "C sources in the wheel"
    for f in _package_sources():
        package = next(p for p, d in PACKAGE_DIRS.items() if d == f.parent.relative_to(
            ROOT).parts[0])
        rel = f.relative_to(ROOT / PACKAGE_DIRS[package])
        assert "/".join((*package.split("."), *rel.parts)) in names, f"{f} not in the wheel"

    venv = tmp_path / "venv"
    _sh(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    py, exe = venv / "bin" / "python", venv / "bin" / "moepack"
    _sh(py, "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path, env=env)
    _sh(py, "-m", "pip", "check", cwd=tmp_path, env=env)
    installed = json.loads(_sh(py, "-m", "pip", "list", "--format", "json",
                               cwd=tmp_path, env=env).stdout)
    names = {_dist_name(d["name"]) for d in installed}
    assert not names & {"torch", "transformers", "safetensors"}, sorted(names)
    r = subprocess.run([py, "-c", "import torch"], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "No module named 'torch'" in r.stderr, r.stderr

    # Everything the package imports, lazily or not, is there; the code comes from the venv.
    declared = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    providers = importlib.metadata.packages_distributions()
    modules = sorted(top for top in _imports(_package_sources())
                     if {_dist_name(d) for d in providers[top]} & declared)
    probe = ("import importlib, pkgutil, moepack\n"
             f"for m in {modules!r}: importlib.import_module(m)\n"
             "# the CLI; two ctypes libraries\n"
             "skip = ('moepack.__main__', 'moepack.runtime._engine', 'moepack.convert._encoder')\n"
             "for m in pkgutil.walk_packages(moepack.__path__, 'moepack.'):\n"
             "    if m.name not in skip: importlib.import_module(m.name)\n"
             "print(moepack.__file__)")
    where = _sh(py, "-c", probe, cwd=tmp_path, env=env).stdout.strip()
    assert Path(where).is_relative_to(venv), where

    r = _sh(exe, "--version", cwd=tmp_path, env=env)
    assert r.stdout == f"moepack {moepack.__version__}\n"
    out = tmp_path / "demo.moepack"
    # a short codebook training (--iters/--sample): the same code paths, a second not 25
    _sh(exe, "convert", ROOT / "demo" / "model", out, "--jobs", 1, "--iters", 1,
        "--sample", 1024, "--quiet", cwd=tmp_path, env=env)
    report = json.loads(_sh(exe, "verify", out, "--json", cwd=tmp_path, env=env).stdout)
    assert report["ok"] and report["damaged"] == [] and report["items_checked"] > 0, report
    gen = json.loads(_sh(exe, "run", out, "Once upon a time", "-n", 4, "--json",
                         cwd=tmp_path, env=env).stdout)
    assert len(gen["tokens"]) == 4 and gen["stats"]["decode_tokens"] == 3, gen
    assert gen["text"], gen


# Base dependencies whose declared minimum is not pinned below: another dependency's own
# requirements lift them (huggingface_hub>=2.0 -> a newer tokenizers; sse-starlette ->
# starlette, fastapi, pydantic), so the resolver never installs their minimum with ours.
LIFTED = {"tokenizers", "fastapi", "starlette", "pydantic", "pydantic-core"}


@pytest.mark.slow
def test_declared_minimum_versions_run_the_cli(tmp_path: Path, wheel: Path) -> None:
    """A user's environment may hold the oldest versions the metadata allows: the wheel with
    every other base dependency pinned to its declared minimum converts, plans, runs and makes
    and checks a torrent (typer>=0.12 and libtorrent>=2.0.9 were declared and did not)."""
    env = _clean_env()
    pins = []
    for req in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9._-]+)>=([0-9.]+)(;.*)?", req)
        assert m, f"{req!r}: a base dependency is declared as NAME>=VERSION"
        if _dist_name(m.group(1)) not in LIFTED:
            pins.append(f"{m.group(1)}=={m.group(2)}{m.group(3) or ''}\n")
    constraints = tmp_path / "lowest.txt"
    constraints.write_text("".join(pins))
    venv = tmp_path / "venv"
    _sh(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    py, exe = venv / "bin" / "python", venv / "bin" / "moepack"
    _sh(py, "-m", "pip", "install", "--quiet", "-c", constraints, wheel, cwd=tmp_path, env=env)
    _sh(py, "-m", "pip", "check", cwd=tmp_path, env=env)

    out = tmp_path / "demo.moepack"
    _sh(exe, "convert", ROOT / "demo" / "model", out, "--jobs", 1, "--iters", 1,
        "--sample", 1024, "--quiet", cwd=tmp_path, env=env)
    _sh(exe, "info", out, cwd=tmp_path, env=env)
    _sh(exe, "plan", out, "--ram", "8GB", cwd=tmp_path, env=env)
    gen = json.loads(_sh(exe, "run", out, "Once upon a time", "-n", 2, "--json",
                         cwd=tmp_path, env=env).stdout)
    assert len(gen["tokens"]) == 2, gen
    _sh(exe, "torrent", "create", out, cwd=tmp_path, env=env)
    # a fetch whose file is already complete: opens the torrent, checks the file, no peers
    dest = tmp_path / "dest"
    dest.mkdir()
    shutil.copy2(out, dest / out.name)
    r = _sh(exe, "fetch", tmp_path / "demo.moepack.torrent", "--dest", dest, "--listen",
            "127.0.0.1:0", cwd=tmp_path, env=env)
    assert "already complete" in r.stdout + r.stderr, r.stdout + r.stderr
