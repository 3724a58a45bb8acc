#!/bin/sh
# The wheels benchmarks/gpu_check.py carries to the device (Python 3.12, torch 2.11, no
# network there): dpobs-otel's own, built here by a Python 3.12 with its C kernel
# (guard/_rowsums.c) compiled for cp312, and the packages the device lacks, at the versions
# the suite uses (constraints/suite.txt), as cp312 manylinux wheels with no dependencies
# (the device has numpy, packaging, typing-extensions and pytest).
#
#   sh benchmarks/gpu_wheels.sh [DIR]      (DIR: .whl, which .gitignore ignores; run's carry)
#   PY312=/path/to/python3.12 sh benchmarks/gpu_wheels.sh
set -eu
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY312=${PY312:-$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python}
"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
    || { echo "PY312 must be a Python 3.12 (pyenv versions lists one)" >&2; exit 1; }
rm -rf "$DIR" build/gpu-wheel
mkdir -p "$DIR"
pin() { grep -i "^$1==" constraints/suite.txt | head -1; }
"$PY312" -m pip wheel -q --no-deps -w "$DIR" .
unzip -l "$DIR"/dpobs_otel-*.whl | grep -q '_rowsums.cpython-312' \
    || { echo "the dpobs wheel has no cp312 C kernel" >&2; exit 1; }
"$PY312" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" \
    "$(pin opentelemetry-api)" "$(pin opentelemetry-sdk)" \
    "$(pin opentelemetry-exporter-prometheus)" "opentelemetry-semantic-conventions==0.66b2" \
    "$(pin prometheus-client)" "$(pin tensordict)" \
    "pyvers==0.2.3" "cloudpickle==3.1.3" "$(pin msgpack)" "$(pin PyYAML)"
ls -l "$DIR"
du -sh "$DIR"
