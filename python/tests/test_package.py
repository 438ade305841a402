"""The package as it reaches other machines: a wheel (`pip wheel ./python`) that carries its C
libraries (scripts/bundle-python), installed with a plain `pip install` into a fresh virtual
environment and used there, with every library it needs but glibc's own loaded from the wheel."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BIN_DIR, SOURCE_DIR

GLIBC = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|"
                   r"libnsl|libnss_.*)\.so")

# In the venv: import the package, use it, and list the shared objects the process mapped.
USE = """
import json, edl, edl.torch, edl.checkpoint, torch
ctx = edl.context()
maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l.split()[-1]})
print(json.dumps({'edl': edl.__file__, 'world': ctx.world_size, 'maps': maps}))
"""


def clean_env():
    """This environment without the build's package on PYTHONPATH (or a library path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.mark.whole_job
def test_wheel_installs_into_a_fresh_venv_with_its_own_libraries(tmp_path):
    pytest.importorskip("pip")
    pytest.importorskip("wheel")
    if not shutil.which("patchelf"):
        pytest.skip("needs patchelf (scripts/install-deps)")
    shutil.copytree(os.path.join(SOURCE_DIR, "python"), tmp_path / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    env = dict(clean_env(), EDL_WHEEL_SOURCE_DIR=SOURCE_DIR,
               EDL_WHEEL_BUILD_DIR=os.path.dirname(BIN_DIR))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "--no-index", "--quiet", "-w", str(tmp_path / "dist"),
                    str(tmp_path / "python")], env=env, check=True, timeout=600)
    wheels = os.listdir(tmp_path / "dist")
    assert len(wheels) == 1 and wheels[0].endswith("-cp39-abi3-linux_x86_64.whl"), wheels
    venv = tmp_path / "venv"  # torch and numpy are the trainer's own: the system's
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                    str(tmp_path / "dist" / wheels[0])], env=clean_env(), check=True, timeout=300)

    import json
    got = json.loads(subprocess.run([py, "-c", USE], cwd=tmp_path, env=clean_env(),
                                    capture_output=True, text=True, check=True).stdout)
    pkg = os.path.dirname(got["edl"])
    assert pkg.startswith(str(venv)) and got["world"] == 1
    own = {"libcurl.so.4", "libcjson.so.1", "libmicrohttpd.so.12", "libxxhash.so.0"}
    assert own <= set(os.listdir(os.path.join(pkg, "_libs")))
    # every library the module needs resolves inside the wheel, glibc's aside
    ldd = subprocess.run(["ldd", os.path.join(pkg, "_edl.abi3.so")], env=clean_env(),
                         capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and not GLIBC.match(parts[0]):
            assert parts[2].startswith(os.path.join(pkg, "_libs") + "/"), line
    # and the process loaded the wheel's copies of the libraries only edl needs, not the
    # machine's (a library that Python or torch loaded first, say libz, is shared by soname)
    loaded = [p for p in got["maps"] if os.path.basename(p) in own]
    assert len(loaded) == len(own), got["maps"]
    assert all(p.startswith(os.path.join(pkg, "_libs") + "/") for p in loaded), loaded
