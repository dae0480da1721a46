#!/usr/bin/env bash
# Opt-in: build Horovod 0.28.1 (the last release), CPU, with Gloo and MPI, for the installed
# PyTorch and TensorFlow (whichever of the two are importable; at least one), cache the wheel, and
# install it. Needed only for `dist=horovod`; `dist=native` needs nothing.
#
#   scripts/install_horovod.sh            # build (or reuse the cached wheel) and install
#   scripts/install_horovod.sh --build-only   # build the wheel into the cache, install nothing (CI builds
#                                         # while other packages are installed, then installs it)
#   DDLKIT_HOROVOD_CACHE=/some/dir ...    # where wheels are cached (default ~/.cache/ddlkit/horovod)
#   DDLKIT_HOROVOD_WHEEL=/path/horovod-0.28.1-....whl ...   # install this wheel, built by this script
#                                         # elsewhere (an image build gets the host's cached one): no build
#
# Why a script and not a requirement: horovod 0.28.1's sdist does not build against today's frameworks,
# so `pip install horovod` fails. Two patches, each checked to apply:
# - PyTorch >= 2.1 headers need C++17, and the sdist pins C++14 in its CMake files: the two
#   `set(CMAKE_CXX_STANDARD 14)` lines become 17 (TensorFlow >= 2.10 already gets C++17 there);
# - TensorFlow (2.16 and later) moved XLA's headers (xla/client/xla_builder.h is gone, and XLA's
#   printer.h includes highwayhash from a directory TensorFlow's compile flags do not name), so
#   horovod/tensorflow/xla_mpi_ops.cc no longer compiles. Everything in it but its #includes is GPU
#   code (Horovod's XLA custom calls run on CUDA or ROCm only), so a CPU build compiles it empty.
# TensorFlow's own ABI and C++ flags come from tf.sysconfig, which Horovod's CMake already reads.
# The build runs without build isolation, so it compiles against the frameworks that are installed,
# not fresh ones pip would pull.
#
# Needs: a C++ compiler, cmake (Debian's 3.25; a pip cmake >= 4 works with
# CMAKE_POLICY_VERSION_MINIMUM=3.5, set below), OpenMPI headers (libopenmpi-dev) for the MPI
# controller, which lets Horovod ranks start under plain `mpirun` (compute=local_mpi).
# The wheel is tied to the frameworks and Python it was built against, so the cache key names them.
set -euo pipefail

HOROVOD_VERSION=0.28.1
build_only=0
case "${1:-}" in
    "") ;;
    --build-only) build_only=1 ;;
    *) echo "install_horovod: unknown option $1 (the one option: --build-only)" >&2; exit 2 ;;
esac
CACHE_ROOT="${DDLKIT_HOROVOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlkit/horovod}"
PY="${PYTHON:-python}"

# "" where the framework is not importable; TensorFlow's C++ start-up notices go to /dev/null
torch_version="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
tf_version="$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null || true)"
if [[ -z "$torch_version" && -z "$tf_version" ]]; then
    echo "install_horovod: neither PyTorch nor TensorFlow is importable with $PY; install one first" \
         "(requirements.txt, or requirements-test.txt for both)" >&2
    exit 1
fi
py_tag="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
key="horovod-$HOROVOD_VERSION" bindings=()
if [[ -n "$torch_version" ]]; then key+="-torch-${torch_version//+/_}"; bindings+=("torch $torch_version"); fi
if [[ -n "$tf_version" ]]; then key+="-tf-${tf_version//+/_}"; bindings+=("tensorflow $tf_version"); fi
frameworks="$(printf '%s, ' "${bindings[@]}")" && frameworks="${frameworks%, }"
cache_dir="$CACHE_ROOT/$key-$py_tag"

# a given wheel is installed as it is; the check below says whether it loads against these frameworks
given="${DDLKIT_HOROVOD_WHEEL:-}"
if [[ -n "$given" && ! -f "$given" ]]; then
    echo "install_horovod: DDLKIT_HOROVOD_WHEEL=$given is not a file; give a wheel this script built, or unset it" >&2
    exit 1
fi
[[ -n "$given" ]] || mkdir -p "$cache_dir"
wheel="${given:-$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)}"
if [[ -n "$given" ]]; then
    echo "install_horovod: installing the given $given"
elif [[ -z "$wheel" ]]; then
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
    sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/& \&\& HAVE_GPU/' "$src/horovod/tensorflow/xla_mpi_ops.cc"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt" \
        && grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU$' "$src/horovod/tensorflow/xla_mpi_ops.cc" || {
        echo "install_horovod: the C++17 or the XLA patch did not apply; the sdist layout changed" >&2
        exit 1
    }

    echo "install_horovod: building horovod $HOROVOD_VERSION against $frameworks ($(nproc) cores) ..."
    start=$(date +%s)
    # Horovod's setup.py defaults to make -j8; match the cores instead so a small machine does
    # not swap. Frameworks are explicit so a missing one fails the build rather than being skipped.
    torch_build=$([[ -n "$torch_version" ]] && echo WITH || echo WITHOUT)
    tf_build=$([[ -n "$tf_version" ]] && echo WITH || echo WITHOUT)
    env MAKEFLAGS="-j$(nproc)" "HOROVOD_${torch_build}_PYTORCH=1" "HOROVOD_${tf_build}_TENSORFLOW=1" \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
        "$PY" -m pip wheel --no-build-isolation --no-deps --quiet "$src" -w "$work/dist"
    echo "install_horovod: built in $(( $(date +%s) - start )) s"
    cp "$work"/dist/horovod-*.whl "$cache_dir/"
    wheel="$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)"
else
    echo "install_horovod: reusing cached $wheel"
fi
if [[ "$build_only" -eq 1 ]]; then
    echo "install_horovod: $wheel is ready (not installed: --build-only; run again without it to install)"
    exit 0
fi

# --no-deps for horovod itself (its pins are loose); its runtime deps are small and listed here
# so pip never touches the frameworks.
"$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PY" -m pip install --quiet --no-deps --force-reinstall "$wheel"
# each binding loads against its framework and was built with both controllers
checks="import horovod"
if [[ -n "$torch_version" ]]; then checks+="; import horovod.torch as h; assert h.mpi_built() and h.gloo_built()"; fi
if [[ -n "$tf_version" ]]; then checks+="; import horovod.tensorflow as h; assert h.mpi_built() and h.gloo_built()"; fi
if ! failure="$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "$checks" 2>&1)"; then
    echo "$failure" | grep -v 'absl::InitializeLog\|oneDNN custom operations' >&2
    if [[ -n "$given" ]]; then
        echo "install_horovod: the given $given does not load against $frameworks (above): it was built" \
             "against other versions; unset DDLKIT_HOROVOD_WHEEL to build one" >&2
    else
        echo "install_horovod: the installed horovod does not load (above); remove $cache_dir to rebuild" >&2
    fi
    exit 1
fi
echo "install_horovod: horovod $HOROVOD_VERSION ok ($frameworks; mpi, gloo)"
