"""Builds torch_ddl._C: the torch-free core (csrc/core) and the torch glue (csrc/torch).

Install with `pip install --no-build-isolation -e .` so that pip builds against the torch that is
already installed instead of fetching another one. UCX is found by tools/find_ucx.py. The CUDA
part (csrc/cuda, csrc/torch/cuda) is built when torch has CUDA and nvcc is found; the build says
which in one line, and TORCH_DDL_CUDA=0 leaves it out.
"""

import glob
import os
import re
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

core_sources = sorted(glob.glob("csrc/core/**/*.cc", recursive=True))
torch_sources = sorted(glob.glob("csrc/torch/*.cpp"))


def cuda_toolkit():
    """Why the CUDA part is left out ("" when it is built): it needs a torch built with CUDA and
    nvcc (from CUDA_HOME, or on the PATH)."""
    if os.environ.get("TORCH_DDL_CUDA", "auto") == "0":
        return "TORCH_DDL_CUDA=0"
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None:
        return f"torch {torch.__version__} has no CUDA"
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return "nvcc was not found (set CUDA_HOME)"
    return ""


def shared_libstdcxx():
    """The libstdc++ that this torch runs with, to link against by its path. A compiler that
    would link libstdc++ statically (a GCC built outside the distribution, with only the archive
    in its own library folder) gives the extension a second copy, whose stream and locale code,
    bound to the data of the copy torch loaded, crashes at the first std::ostringstream."""
    if not sys.platform.startswith("linux"):
        return []
    with open("/proc/self/maps") as maps:
        found = sorted(set(re.findall(r"\S*/libstdc\+\+\.so\.6[.0-9]*", maps.read())))
    return found[:1]


# TORCH_DDL_SANITIZE=address or thread: a build for the real-process tests under a sanitizer
# (make test-asan-python, make test-tsan-python; docs/testing.md).
SANITIZE = os.environ.get("TORCH_DDL_SANITIZE", "")
if SANITIZE not in ("", "address", "thread"):
    sys.exit(f"torch_ddl: TORCH_DDL_SANITIZE={SANITIZE}: give address or thread")
sanitize = [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer"] if SANITIZE else []
optimize = ["-O1", "-g"] if SANITIZE else ["-O3"]



def core_objects():
    """The core's objects that `make` compiled into TORCH_DDL_CORE_OBJECTS (the Makefile's
    build/core, position-independent, -O3): linked as they are instead of compiled again. Empty
    when the variable is unset: then the core is compiled here with the rest."""
    where = os.environ.get("TORCH_DDL_CORE_OBJECTS", "")
    if not where:
        return []
    import torch

    if SANITIZE:
        sys.exit("torch_ddl: TORCH_DDL_CORE_OBJECTS and TORCH_DDL_SANITIZE together: the "
                 "objects were not built with the sanitizer")
    if not torch._C._GLIBCXX_USE_CXX11_ABI:
        sys.exit(f"torch_ddl: torch {torch.__version__} uses the old C++ string ABI, which the "
                 f"objects in {where} were not built for: unset TORCH_DDL_CORE_OBJECTS")
    objects = [os.path.join(where, source[:-len(".cc")] + ".o") for source in core_sources]
    missing = [o for o in objects if not os.path.exists(o)]
    if missing:
        sys.exit(f"torch_ddl: TORCH_DDL_CORE_OBJECTS={where} lacks {len(missing)} of the core's "
                 f"{len(objects)} objects, e.g. {missing[0]} (run `make core-objects`)")
    return objects


objects = core_objects()
sources = torch_sources if objects else core_sources + torch_sources
why_not = "" if not SANITIZE else "a sanitizer build"
why_not = why_not or cuda_toolkit()
common = dict(
    include_dirs=[UCX_INCLUDE],
    library_dirs=[UCX_LIB],
    libraries=["ucp", "uct", "ucs"],
    extra_objects=objects,
    # A changed object relinks the extension: the build compares its sources and depends only.
    depends=objects,
    extra_link_args=[f"-Wl,-rpath,{UCX_LIB}"] + shared_libstdcxx() + sanitize,
)
if why_not:
    print(f"torch_ddl: building without CUDA ({why_not})")
    extension = CppExtension(
        "torch_ddl._C",
        sources,
        extra_compile_args=optimize + ["-std=c++20", "-Wall"] + sanitize,
        **common,
    )
else:
    from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension

    print(f"torch_ddl: building with CUDA (nvcc in {CUDA_HOME})")
    sources = [s for s in sources if not s.endswith("no_device_streams.cpp")]
    sources += sorted(glob.glob("csrc/cuda/*.cu")) + sorted(glob.glob("csrc/torch/cuda/*.cpp"))
    extension = CUDAExtension(
        "torch_ddl._C",
        sources,
        extra_compile_args={"cxx": ["-O3", "-std=c++20", "-Wall"],
                            "nvcc": ["-O3", "-std=c++20"]},
        **common,
    )

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
