"""Builds the C engine (runtime/src) and the converter's encoder (convert/native) as plain shared
libraries loaded with ctypes."""

import glob
import re
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class PlainLibrary(build_ext):
    """The libraries have no Python API: export their C symbols, not PyInit_*."""

    def get_export_symbols(self, ext):
        return []


def package_version() -> str:
    """`__version__` of moepack/__init__.py, the one place it is defined (read, not imported:
    the package cannot be imported before it is built)."""
    text = (Path(__file__).parent / "moepack" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"$', text, re.M).group(1)


engine = Extension(
    "moepack.runtime._engine",
    sources=sorted(glob.glob("runtime/src/*.c")),
    include_dirs=["runtime/include", "runtime/src"],
    define_macros=[("MOEPACK_VERSION", f'"{package_version()}"')],  # mp_version()
    # the headers: rebuild when one changes, and ship them in the sdist
    depends=sorted(glob.glob("runtime/src/*.h") + glob.glob("runtime/include/*.h"))
    + ["moepack/__init__.py"],
    extra_compile_args=["-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread",
                        "-fvisibility=hidden", "-Wall", "-Wextra"],
    extra_link_args=["-pthread", "-lm"],
)

# k-means / RVQ encoding loops: only the converter loads them (the engine never encodes)
encoder = Extension(
    "moepack.convert._encoder",
    sources=sorted(glob.glob("convert/native/*.c")),
    depends=sorted(glob.glob("convert/native/*.h")),
    extra_compile_args=engine.extra_compile_args,
    extra_link_args=["-lm"],
)

setup(ext_modules=[engine, encoder], cmdclass={"build_ext": PlainLibrary})
