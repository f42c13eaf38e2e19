"""Locates UCX for the build: UCX_HOME, else the libucx-cu13 wheel, else pkg-config.

Used by setup.py (imported) and the Makefile (run: prints the include or library directory).
"""

import importlib.util
import os
import shutil
import subprocess
import sys


class UcxNotFound(RuntimeError):
    pass


def _layout(prefix):
    include = os.path.join(prefix, "include")
    for libdir in ("lib", "lib64"):
        lib = os.path.join(prefix, libdir)
        if os.path.exists(os.path.join(include, "ucp", "api", "ucp.h")) and os.path.isdir(lib):
            return include, lib
    return None


def find_ucx():
    """Returns (source, include_dir, lib_dir)."""
    tried = []
    home = os.environ.get("UCX_HOME")
    if home:
        found = _layout(home)
        if found:
            return ("UCX_HOME", *found)
        tried.append(f"UCX_HOME={home} has no include/ucp/api/ucp.h with a lib/ beside it")
    else:
        tried.append("UCX_HOME is not set")

    spec = importlib.util.find_spec("libucx")
    if spec and spec.submodule_search_locations:
        found = _layout(list(spec.submodule_search_locations)[0])
        if found:
            return ("libucx-cu13 wheel", *found)
        tried.append("the libucx wheel is installed but has no headers")
    else:
        tried.append("the libucx-cu13 wheel is not installed (pip install libucx-cu13)")

    if shutil.which("pkg-config"):
        try:
            cflags = subprocess.check_output(
                ["pkg-config", "--cflags-only-I", "ucx"], text=True, stderr=subprocess.DEVNULL)
            libs = subprocess.check_output(
                ["pkg-config", "--variable=libdir", "ucx"], text=True, stderr=subprocess.DEVNULL)
            include = cflags.strip()[2:] if cflags.strip() else "/usr/include"
            return ("pkg-config", include, libs.strip())
        except subprocess.CalledProcessError:
            tried.append("pkg-config knows no 'ucx' package (apt-get install libucx-dev)")
    else:
        tried.append("pkg-config is not installed")
    raise UcxNotFound("UCX not found. Tried, in order:\n  - " + "\n  - ".join(tried))


if __name__ == "__main__":
    try:
        source, include, lib = find_ucx()
    except UcxNotFound as e:
        print(e, file=sys.stderr)
        sys.exit(1)
    what = sys.argv[1] if len(sys.argv) > 1 else "--all"
    print({"--include": include, "--lib": lib, "--source": source}.get(what, f"{source} {include} {lib}"))
