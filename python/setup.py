"""setup.py: `pip install --no-build-isolation ./python` (offline) builds the edl package with
its C extension module through the project's own CMake build (the libraries it binds are built
from this source tree), then installs python/edl and the module like any package;
`pip wheel --no-build-isolation ./python` makes a wheel of it.

The module carries its C dependencies (scripts/bundle-python): the shared libraries it needs,
glibc's aside, go into edl/_libs beside it, found through an $ORIGIN rpath. So the wheel
installs with a plain `pip install` where none of them nor any -dev package or compiler is
(x86-64 Linux, glibc at least the build machine's, Python >= 3.9).

Building needs cmake, a C compiler and the libraries' -dev packages (scripts/install-deps
--no-test), python3-dev, patchelf, setuptools and wheel."""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# EDL_WHEEL_SOURCE_DIR: the source tree when python/ was copied elsewhere (the package's own
# test builds a wheel from a copy); EDL_WHEEL_BUILD_DIR: an existing CMake build of it to build
# the module in, as configured (else a Release build of its own under build_temp).
ROOT = os.environ.get("EDL_WHEEL_SOURCE_DIR") or os.path.dirname(HERE)


class CMakeBuild(build_ext):
    """Build edl._edl with CMake instead of compiling sources here (one build description)."""

    def build_extension(self, ext):
        build = os.environ.get("EDL_WHEEL_BUILD_DIR")
        if not build:
            build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DEDL_BUILD_TESTS=OFF", "-DEDL_BUILD_BENCH=OFF",
                                   f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "_edl", "edl_python", "-j",
                               str(os.cpu_count() or 1)])
        bundle = os.path.abspath(os.path.join(self.build_temp, "bundle"))
        subprocess.check_call([os.path.join(ROOT, "scripts", "bundle-python"),
                               os.path.join(build, "python", "edl"), bundle])
        out = self.get_ext_fullpath(ext.name)
        libs = os.path.join(os.path.dirname(out), "_libs")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(os.path.join(bundle, "edl", "_edl.abi3.so"), out)
        shutil.rmtree(libs, ignore_errors=True)
        shutil.copytree(os.path.join(bundle, "edl", "_libs"), libs)


setup(
    name="edl",
    version="0.1.0",
    description="edl for Python trainers: elastic PyTorch in process, checkpoints of tensors, "
                "parameter servers (Fleet's roles, sparse embeddings), distillation readers",
    packages=["edl"],
    ext_modules=[Extension("edl._edl", sources=[], py_limited_api=True)],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],  # edl.ps and edl.distill; torch is the trainer's own choice
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
