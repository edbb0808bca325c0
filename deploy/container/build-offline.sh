#!/usr/bin/env bash
# Builds the etcd-cache-proxy image with buildah on a machine that reaches Debian's
# packages and crates.io but no image registry: the builder's base and (with
# `--runtime debian`) the final stage's base are root filesystems made with mmdebstrap,
# and the Rust toolchain is the host's, mounted read-only into the build.
#
#   deploy/container/build-offline.sh [--runtime scratch|debian] [--tag NAME]
#
# Needs root, buildah, mmdebstrap and a Rust >= 1.90 toolchain (`rustc --print sysroot`).
# The two base images are made once and kept (localhost/etcd-cache-proxy-builder-base,
# localhost/etcd-cache-proxy-runtime-debian); cargo's output is kept in
# $ETCD_CACHE_IMAGE_WORK/target (default /var/tmp/etcd-cache-proxy-image), so a second
# build is incremental. BUILDAH_ISOLATION defaults to chroot, which builds where the OCI
# runtime cannot start a container (see README.md).
set -euo pipefail

runtime=scratch
tag=localhost/etcd-cache-proxy:latest
while [ $# -gt 0 ]; do
    case "$1" in
        --runtime) runtime="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        *) echo "usage: $0 [--runtime scratch|debian] [--tag NAME]" >&2; exit 2 ;;
    esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="${ETCD_CACHE_IMAGE_WORK:-/var/tmp/etcd-cache-proxy-image}"
suite="${DEBIAN_SUITE:-bookworm}"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
mkdir -p "$work/target"

# Makes image $1 from a root filesystem that mmdebstrap makes with the other arguments.
image_from_debian() {
    local name="$1"; shift
    if buildah inspect --type image "$name" >/dev/null 2>&1; then
        return
    fi
    local tar="$work/${name##*/}.tar"
    mmdebstrap "$@" "$suite" "$tar"
    local ctr
    ctr="$(buildah from scratch)"
    buildah add "$ctr" "$tar" /
    buildah config \
        --env PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env CARGO_HOME=/usr/local/cargo \
        "$ctr"
    buildah commit --rm "$ctr" "$name"
    rm -f "$tar"
}

builder=localhost/etcd-cache-proxy-builder-base
image_from_debian "$builder" --variant=minbase \
    --include=gcc,libc6-dev,make,protobuf-compiler,libprotobuf-dev,busybox-static,ca-certificates
case "$runtime" in
    scratch) base=scratch ;;
    debian)
        base=localhost/etcd-cache-proxy-runtime-debian
        # Only what the binary links (glibc, libgcc), unpacked: no shell, no package manager.
        image_from_debian "$base" --variant=extract --include=libc6,libgcc-s1
        ;;
    *) echo "--runtime is scratch or debian" >&2; exit 2 ;;
esac

sysroot="$(rustc --print sysroot)"
registry="${CARGO_HOME:-$HOME/.cargo}/registry"
mkdir -p "$registry"
buildah bud --format docker \
    -f "$here/Containerfile" --ignorefile "$here/Containerfile.dockerignore" \
    --build-arg BUILDER_IMAGE="$builder" --build-arg RUNTIME_IMAGE="$base" \
    -v "$sysroot:/usr/local/rust:ro" \
    -v "$registry:/usr/local/cargo/registry" \
    -v "$work/target:/src/target" \
    -t "$tag" "$repo"
