#!/usr/bin/env bash
# Build ddlkit's images from docker/Dockerfile, tagged as ddlkit.compute.containers.default_image names them (the
# default of a remote target's compute.image), and push them with --push. From a checkout:
#
#   scripts/build_images.sh [--engine docker|podman] [--variant cuda|cpu] [--registry REGISTRY] [--horovod]
#                           [--push] [FRAMEWORK...] [-- BUILD OPTIONS...]
#
#   az acr login --name myregistry                     # or `docker login` for Docker Hub
#   scripts/build_images.sh --registry myregistry.azurecr.io/ddlkit --push      # all three, CUDA
#   scripts/build_images.sh --variant cpu --horovod              # docker.io/ddlkit/pytorch:0.1.0-cpu-horovod, ...
#
# FRAMEWORK: pytorch, tensorflow, keras (default: all three). --engine: docker (default when on PATH) or
# podman. --variant: cuda (default) or cpu. --registry: where the tags point (default docker.io/ddlkit).
# --horovod: Horovod 0.28.1 in the image, for dist=horovod (--variant cpu only: its NCCL build needs the CUDA
# toolkit), tagged ...-horovod; a wheel scripts/install_horovod.sh built, in a PIP_FIND_LINKS directory mounted
# into the build, is installed, else it is built (5-9 minutes). Options after `--` go to `<engine> build` as
# they are (--build-arg BASE=IMAGE@sha256:..., --no-cache, ...).
# Needs a Python that can import ddlkit's dependencies (pip install -r requirements.txt): the tags come from
# this checkout's ddlkit.compute.containers.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"

usage_error() {
    echo "build_images.sh: error: $1 (usage: scripts/build_images.sh [--engine docker|podman] [--variant cuda|cpu]" \
        "[--registry REGISTRY] [--horovod] [--push] [FRAMEWORK...] [-- BUILD OPTIONS...])" >&2
    exit 2
}

engine="" variant=cuda registry=docker.io/ddlkit horovod=0 push=0 frameworks=() build_options=()
while (($#)); do
    case "$1" in
        --engine) engine="${2:-}"; shift 2 || usage_error "--engine needs docker or podman" ;;
        --variant) variant="${2:-}"; shift 2 || usage_error "--variant needs cuda or cpu" ;;
        --registry) registry="${2:-}"; shift 2 || usage_error "--registry needs one, e.g. myregistry.azurecr.io/ddlkit" ;;
        --horovod) horovod=1; shift ;;
        --push) push=1; shift ;;
        --) shift; build_options=("$@"); break ;;
        -*) usage_error "unknown option $1" ;;
        *) frameworks+=("$1"); shift ;;
    esac
done

if [[ -z "$engine" ]]; then
    engine=$(command -v docker >/dev/null && echo docker || echo podman)
fi
case "$engine" in
    docker) ;;
    # podman's default image format (OCI) drops the Dockerfile's SHELL; docker's keeps it
    podman) build_options=(--format docker "${build_options[@]}") ;;
    *) usage_error "--engine is docker or podman, not '$engine'" ;;
esac
[[ "$variant" == cuda || "$variant" == cpu ]] || usage_error "--variant is cuda or cpu, not '$variant'"
# docker/Dockerfile refuses it too, but only after the base image is pulled
((horovod == 0)) || [[ "$variant" == cpu ]] || usage_error "--horovod builds the CPU images only (add --variant \
cpu): Horovod's NCCL build needs the CUDA toolkit, which ddlkit's base image lacks (docs/how-to/docker.md)"

# "FRAMEWORK TAG" lines; a bad framework or registry is refused with ddlkit's own message
tags="$(PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$variant" "$registry" "$horovod" "${frameworks[@]}" <<'EOF'
import sys

try:
    from ddlkit.compute.containers import default_image, release_frameworks
    from ddlkit.errors import ConfigError
except ImportError as err:
    print(f"build_images.sh: error: cannot import ddlkit ({err}); pip install -r requirements.txt", file=sys.stderr)
    sys.exit(2)

variant, registry, horovod, *frameworks = sys.argv[1:]
try:
    for framework in frameworks or release_frameworks():
        print(framework, default_image(framework, gpu=variant == "cuda", registry=registry, horovod=horovod == "1"))
except ConfigError as err:
    print(f"build_images.sh: error: {err}", file=sys.stderr)
    sys.exit(2)
EOF
)"
command -v "$engine" >/dev/null || usage_error "$engine is not on PATH; install it or choose the other with --engine"

while read -r framework tag; do
    echo "build_images.sh: building $tag ($engine)"
    start=$(date +%s)
    "$engine" build -f "$repo/docker/Dockerfile" --build-arg "FRAMEWORK=$framework" --build-arg "VARIANT=$variant" \
        --build-arg "HOROVOD=$horovod" -t "$tag" "${build_options[@]}" "$repo"
    echo "build_images.sh: built $tag in $(($(date +%s) - start)) s"
    if ((push)); then
        "$engine" push "$tag"
    fi
done <<< "$tags"
