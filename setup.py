"""Everything is in pyproject.toml but what needs code: the DPOBS_AUTO start-up hook,
the guard's one-pass kernel and the Ray adapter's op path in C.

A .pth file must sit at the top of site-packages to run at interpreter start, which package
data cannot do, so build_py copies dpobs_otel/dpobs-otel-auto.pth beside the package (see
dpobs_otel/auto.py for what its one line does).

The kernel (dpobs_otel/guard/_rowsums.c) is plain C that the guard loads with ctypes
(guard/kernel.py). It is optional: where it cannot be built, the install goes on and the
guard runs its torch kernels instead."""
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "dpobs-otel-auto.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("dpobs_otel", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


ROWSUMS = Extension(
    "dpobs_otel.guard._rowsums", ["dpobs_otel/guard/_rowsums.c"], optional=True,
    # -Wno-psabi: gcc notes that AVX vectors change the ABI of functions that are all inlined.
    extra_compile_args=["-O3", "-Wno-psabi"])

# The Ray adapter's op path (dpobs_otel/adapters/ray/_fast.c): optional too, ops.py runs the
# same path in Python where it is not built.
RAY_FAST = Extension("dpobs_otel.adapters.ray._fast", ["dpobs_otel/adapters/ray/_fast.c"],
                     optional=True, extra_compile_args=["-O2"])

setup(cmdclass={"build_py": BuildPyWithStartupHook}, ext_modules=[ROWSUMS, RAY_FAST])
