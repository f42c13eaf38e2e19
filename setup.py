"""Builds torch_ddl._C: the torch-free core (csrc/core) and the torch glue (csrc/torch).

Install with `pip install --no-build-isolation -e .` so that pip builds against the torch that is
already installed instead of fetching another one. UCX is found by tools/find_ucx.py.
"""

import glob
import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tools"))
from find_ucx import UcxNotFound, find_ucx  # noqa: E402

try:
    UCX_SOURCE, UCX_INCLUDE, UCX_LIB = find_ucx()
except UcxNotFound as error:
    sys.exit(f"torch_ddl: {error}")
print(f"torch_ddl: using UCX from {UCX_SOURCE} ({UCX_INCLUDE}, {UCX_LIB})")

sources = sorted(glob.glob("csrc/core/**/*.cc", recursive=True)) + sorted(
    glob.glob("csrc/torch/*.cpp"))

setup(
    ext_modules=[
        CppExtension(
            "torch_ddl._C",
            sources,
            include_dirs=[UCX_INCLUDE],
            library_dirs=[UCX_LIB],
            libraries=["ucp", "uct", "ucs"],
            extra_compile_args=["-O3", "-std=c++20", "-Wall"],
            extra_link_args=[f"-Wl,-rpath,{UCX_LIB}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
