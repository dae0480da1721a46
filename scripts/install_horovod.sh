#!/usr/bin/env bash
# Opt-in: build Horovod 0.28.1 (the last release) for the installed PyTorch, CPU, with Gloo and MPI,
# cache the wheel, and install it. Needed only for `dist=horovod`; `dist=native` needs nothing.
#
#   scripts/install_horovod.sh            # build (or reuse the cached wheel) and install
#   DDLKIT_HOROVOD_CACHE=/some/dir ...    # where wheels are cached (default ~/.cache/ddlkit/horovod)
#
# Why a script and not a requirement: horovod 0.28.1's sdist pins C++14 in its CMake files, and
# PyTorch >= 2.1 headers need C++17, so `pip install horovod` fails against torch 2.x. We patch the
# two `set(CMAKE_CXX_STANDARD 14)` lines to 17 and build without build isolation (so it compiles
# against the torch that is installed, not a fresh one pip would pull). TensorFlow is left out on
# purpose: horovod 0.28.1 does not build against TF >= 2.16 (see README, "Horovod").
#
# Needs: a C++ compiler, cmake (Debian's 3.25; a pip cmake >= 4 works with
# CMAKE_POLICY_VERSION_MINIMUM=3.5, set below), OpenMPI headers (libopenmpi-dev) for the MPI
# controller, which lets Horovod ranks start under plain `mpirun` (compute=local_mpi).
# The wheel is tied to the torch and Python it was built against, so the cache key includes both.
set -euo pipefail

HOROVOD_VERSION=0.28.1
CACHE_ROOT="${DDLKIT_HOROVOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlkit/horovod}"
PY="${PYTHON:-python}"

torch_version="$("$PY" -c 'import torch; print(torch.__version__)')" || {
    echo "install_horovod: PyTorch is not importable with $PY; install torch first (requirements.txt)" >&2
    exit 1
}
py_tag="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
cache_dir="$CACHE_ROOT/horovod-$HOROVOD_VERSION-torch-${torch_version//+/_}-$py_tag"
mkdir -p "$cache_dir"

wheel="$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$wheel" ]]; then
    if ! command -v cmake >/dev/null; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
            apt-get install -y -qq cmake
        else
            echo "install_horovod: cmake not found; install it (apt-get install cmake)" >&2
            exit 1
        fi
    fi
    if ! command -v mpicxx >/dev/null; then
        echo "install_horovod: OpenMPI headers not found (mpicxx); apt-get install openmpi-bin libopenmpi-dev" >&2
        exit 1
    fi
    cmake_major="$(cmake --version | awk 'NR==1{split($3,v,"."); print v[1]}')"
    if [[ "$cmake_major" -ge 4 ]]; then
        # cmake 4 refuses the `cmake_minimum_required(VERSION 2.8...)` of Horovod's vendored deps.
        export CMAKE_POLICY_VERSION_MINIMUM=3.5
    fi

    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt" || {
        echo "install_horovod: the C++17 patch did not apply; the sdist layout changed" >&2
        exit 1
    }

    echo "install_horovod: building horovod $HOROVOD_VERSION against torch $torch_version ($(nproc) cores) ..."
    start=$(date +%s)
    # Horovod's setup.py defaults to make -j8; match the cores instead so a small machine does
    # not swap. Frameworks are explicit so a missing one fails the build rather than being skipped.
    MAKEFLAGS="-j$(nproc)" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
        "$PY" -m pip wheel --no-build-isolation --no-deps --quiet "$src" -w "$work/dist"
    echo "install_horovod: built in $(( $(date +%s) - start )) s"
    cp "$work"/dist/horovod-*.whl "$cache_dir/"
    wheel="$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)"
else
    echo "install_horovod: reusing cached $wheel"
fi

# --no-deps for horovod itself (its pins are loose); its runtime deps are small and listed here
# so pip never touches torch.
"$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PY" -m pip install --quiet --no-deps --force-reinstall "$wheel"
"$PY" -c 'import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built(); print("install_horovod: horovod", __import__("horovod").__version__, "ok (torch, mpi, gloo)")'
