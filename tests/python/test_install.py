"""How torch_ddl is found: torch loads 'ddl' through its "torch.backends" entry point (no
`import torch_ddl` needed, the extension loaded only when a group is created), and a source
checkout ahead of an installed build on sys.path uses the installed extension."""

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points

import pytest
import torch_ddl


def _python(code, tmp_path, flags=(), **env):
    environment = dict(os.environ, **env)
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=environment)


def _without_this_install(*paths):
    """Flags and PYTHONPATH for an interpreter that sees `paths`, then site-packages, but not
    this checkout's editable install (its .pth finder would answer for torch_ddl first)."""
    return ("-S",), os.pathsep.join([*map(str, paths), sysconfig.get_paths()["purelib"]])


AUTOLOADED = """
import sys
import torch, torch.distributed as dist
assert "ddl" in dist.Backend.backend_list, dist.Backend.backend_list
assert "torch_ddl" not in sys.modules and "torch_ddl._C" not in sys.modules, "loaded early"
dist.init_process_group("ddl", init_method="file://{store}", rank=0, world_size=1)
assert "torch_ddl._C" in sys.modules
t = torch.arange(4.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
assert dist.get_backend() == "ddl"
import torch_ddl  # still harmless
dist.destroy_process_group()
print("ok")
"""


def test_torch_loads_ddl_when_a_group_is_created(tmp_path):
    if not any(e.name == "torch_ddl" for e in entry_points(group="torch.backends")):
        pytest.skip("torch_ddl is not installed with its entry point (pip install .)")
    done = _python(AUTOLOADED.format(store=tmp_path / "store"), tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    # Turned off the way torch documents: then 'ddl' is unknown until torch_ddl is imported.
    off = _python("import torch.distributed as dist; print('ddl' in dist.Backend.backend_list)",
                  tmp_path, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert off.stdout.strip() == "False", off.stderr[-3000:]


def test_a_checkout_ahead_of_an_installed_build_uses_the_installed_extension(tmp_path):
    package = os.path.dirname(torch_ddl.__file__)
    built = os.path.basename(torch_ddl._C.__file__)
    site, checkout = tmp_path / "site", tmp_path / "checkout"
    shutil.copytree(package, site / "torch_ddl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(package, checkout / "torch_ddl",
                    ignore=shutil.ignore_patterns("__pycache__", "_C.*"))
    assert not any(n.startswith("_C.") for n in os.listdir(checkout / "torch_ddl"))
    code = "import torch_ddl; print(torch_ddl._C.__file__); print(torch_ddl._C.ucx_version())"
    flags, path = _without_this_install(checkout, site)
    done = _python(code, checkout, flags, PYTHONPATH=path, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == str(site / "torch_ddl" / built), done.stdout
    # Nowhere to be found: an ImportError that says how to build it.
    flags, path = _without_this_install(checkout)
    alone = _python("import torch_ddl", checkout, flags, PYTHONPATH=path,
                    TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert alone.returncode != 0 and "pip install --no-build-isolation" in alone.stderr, \
        alone.stderr[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="reads the extension's ELF dynamic section with readelf")
def test_the_extension_uses_the_libstdcxx_torch_loaded():
    # A second, static copy of libstdc++ inside the extension (a compiler whose own library
    # folder has only the archive) crashes at the first std::ostringstream: its code runs on
    # the data of the copy torch loaded. setup.py links the loaded one by its path.
    needed = subprocess.run(["readelf", "-d", torch_ddl._C.__file__], capture_output=True,
                            text=True, check=True).stdout
    assert "[libstdc++.so.6]" in needed, needed
    symbols = subprocess.run(["readelf", "-W", "--dyn-syms", torch_ddl._C.__file__],
                             capture_output=True, text=True, check=True).stdout
    # std::locale::classic(), defined in libstdc++: present (not UND) only in a static copy.
    own = [line for line in symbols.splitlines()
           if line.endswith(" _ZNSt6locale7classicEv") and " UND " not in line]
    assert not own, own
