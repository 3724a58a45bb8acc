"""Everything is in pyproject.toml; this file only ships the DPOBS_AUTO start-up hook.

A .pth file must sit at the top of site-packages to run at interpreter start, which package
data cannot do, so build_py copies dpobs_otel/dpobs-otel-auto.pth beside the package (see
dpobs_otel/auto.py for what its one line does)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "dpobs-otel-auto.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("dpobs_otel", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
