"""Builds the C engine (runtime/src) as a plain shared library loaded with ctypes."""

import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class PlainLibrary(build_ext):
    """The engine has no Python API: export its C symbols, not PyInit_*."""

    def get_export_symbols(self, ext):
        return []


engine = Extension(
    "moepack.runtime._engine",
    sources=sorted(glob.glob("runtime/src/*.c")),
    include_dirs=["runtime/include", "runtime/src"],
    # the headers: rebuild when one changes, and ship them in the sdist
    depends=sorted(glob.glob("runtime/src/*.h") + glob.glob("runtime/include/*.h")),
    extra_compile_args=["-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread",
                        "-fvisibility=hidden", "-Wall", "-Wextra"],
    extra_link_args=["-pthread", "-lm"],
)

setup(ext_modules=[engine], cmdclass={"build_ext": PlainLibrary})
