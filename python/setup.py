"""Builds the package for pip: configures the gradsnap source tree above this folder with CMake
for the interpreter pip runs (GRADSNAP_PIP_BUILD_DIR, default build-pip/ in the tree; its
compiler launcher from GRADSNAP_PIP_CMAKE_ARGS), builds the target gradsnap_python with
GRADSNAP_PYTHON_WHEEL=ON, and puts build/python/gradsnap/ with libgradsnap.so (found next to
the module: its runtime path is $ORIGIN alone) into the wheel."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_py):
    def run(self):
        build = os.environ.get("GRADSNAP_PIP_BUILD_DIR", os.path.join(ROOT, "build-pip"))
        extra = os.environ.get("GRADSNAP_PIP_CMAKE_ARGS", "").split()
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                        f"-DPython_EXECUTABLE={sys.executable}", "-DGRADSNAP_PYTHON_WHEEL=ON",
                        *extra], check=True)
        jobs = os.environ.get("GRADSNAP_PIP_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", build, "-j", jobs, "--target", "gradsnap_python"],
                       check=True)
        dest = os.path.join(self.build_lib, "gradsnap")
        # Nothing left from an earlier build (setuptools keeps python/build/ between runs).
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(os.path.join(build, "python", "gradsnap"), dest, dirs_exist_ok=True)
        for lib in glob.glob(os.path.join(build, "lib", "libgradsnap.so.*")):
            if os.path.islink(lib):  # the SONAME the module needs, copied as a file
                shutil.copy2(lib, dest)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": CMakeBuild}, distclass=BinaryDistribution)
