#!/usr/bin/env bash
# Builds enroot and pyxis from their public sources into one directory, for the pyxis loopback
# check (tests/manual/pyxis_loopback.py). Outside pytest: CI reaches package registries only, not
# GitHub, so it cannot fetch these sources.
#
#   bash tests/manual/build_pyxis_enroot.sh BUILD_DIR ENROOT_GIT_DIR PYXIS_GIT_DIR
#
# ENROOT_GIT_DIR, PYXIS_GIT_DIR: git directories (bare clones) of NVIDIA/enroot and NVIDIA/pyxis.
# Needs (Debian 12): build-essential libslurm-dev libbsd-dev squashfs-tools jq parallel zstd curl.
# enroot's own build links a static musl libbsd from git submodules; FORCE_GLIBC=1 links Debian's
# libbsd instead, and the makeself submodule (for `enroot bundle` only) is left out.
set -euo pipefail
B=$(realpath -m "${1:?build directory}")
ENROOT_GIT=${2:?git dir of NVIDIA/enroot}
PYXIS_GIT=${3:?git dir of NVIDIA/pyxis}
ENROOT_REF=${ENROOT_REF:-v4.1.2}
PYXIS_REF=${PYXIS_REF:-v0.24.0}
mkdir -p "$B"
rm -rf "$B/enroot-src" "$B/pyxis-src" "$B/enroot"
mkdir "$B/enroot-src" "$B/pyxis-src"
git --git-dir="$ENROOT_GIT" archive "$ENROOT_REF" | tar -x -C "$B/enroot-src"
git --git-dir="$PYXIS_GIT" archive "$PYXIS_REF" | tar -x -C "$B/pyxis-src"
sed -i -e 's|^DEPS := deps/dist/makeself/bin/enroot-makeself \\$|DEPS :=|' \
  -e 's|^\t-git submodule update --init$|\t@true|' -e 's|^\t$(MAKE) -C deps$|\t@true|' \
  "$B/enroot-src/Makefile"
make -s -C "$B/enroot-src" FORCE_GLIBC=1 prefix="$B/enroot" sysconfdir="$B/enroot/etc" install
make -s -C "$B/pyxis-src"
"$B/enroot/bin/enroot" version
echo "built: $B/enroot/bin/enroot, $B/pyxis-src/spank_pyxis.so"
