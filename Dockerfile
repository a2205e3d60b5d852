# The recipe's image for multi-node: the recipe's image (the seed: radixark/miles v0.1.0) pinned by
# digest, with the AWS EFA installer's user-space part added (the seed's stack.source: "radixark/
# miles v0.1.0 (amd64 digest sha256:45ae...) with EFA 1.49 added"). docs/image.md says more.
#
# Built by `reproduce image build RECIPE --push REGISTRY --efa-installer FILE --efa-sha256 HEX`,
# which passes the recipe's repository and digest, checks the installer against the pinned
# checksum, builds in a context of its own (this file, scripts/, the installer), pushes, and
# records the pushed digest and the base digest. By hand, from a directory holding this file,
# scripts/ and the installer as efa-installer.tar.gz:
#
#   docker build --build-arg EFA_INSTALLER_SHA256=<sha256 of the tarball> -t <registry>/miles:<tag> .
#
# FROM names a digest, never a tag: the base cannot float. An image built from this file has its
# own digest; a run uses it through the profile's `image` (schema/profile.schema.yaml), which must
# name the recipe's digest as its base. Tests build it from a tiny base in a local registry, with a
# stand-in installer (tests/test_image_build.py); no step here downloads anything.
ARG BASE_IMAGE=radixark/miles
ARG BASE_DIGEST=sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca
FROM ${BASE_IMAGE}@${BASE_DIGEST}
ARG BASE_IMAGE
ARG BASE_DIGEST

# The installer comes from the build context, never from the network: download it once
# (https://efa-installer.amazonaws.com/aws-efa-installer-<version>.tar.gz), verify it (GPG
# signature, or AWS's published SHA256), and pass its sha256; a tarball that differs stops here.
# libfabric + aws-ofi-nccl in user space only: the kernel module belongs to the host (the DLAMI).
ARG EFA_INSTALLER_VERSION=1.49.0
ARG EFA_INSTALLER_SHA256=
COPY efa-installer.tar.gz /tmp/efa-installer.tar.gz
RUN set -eu; \
    cd /tmp; \
    if [ -z "${EFA_INSTALLER_SHA256}" ]; then \
      echo "EFA_INSTALLER_SHA256 is not set: the installer must be pinned by its checksum" >&2; \
      exit 1; \
    fi; \
    echo "${EFA_INSTALLER_SHA256}  efa-installer.tar.gz" | sha256sum -c -; \
    tar xzf efa-installer.tar.gz; \
    cd aws-efa-installer; \
    ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify; \
    cd /; \
    rm -rf /tmp/aws-efa-installer /tmp/efa-installer.tar.gz

# The launcher's node-side programs (preflight, stack probe, rollout function); at run time the
# launcher mounts the current ones over this copy.
COPY scripts/ /opt/reproduce/scripts/
ENV PYTHONPATH=/root/miles:/root/Megatron-LM:/opt/reproduce/scripts

# What it derives from (OCI image-spec annotations), checked by the build and by every node that
# pulls it: the base digest must be the recipe's.
LABEL org.opencontainers.image.base.digest="${BASE_DIGEST}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}@${BASE_DIGEST}" \
      dev.reproduce.efa-installer.version="${EFA_INSTALLER_VERSION}" \
      dev.reproduce.efa-installer.sha256="${EFA_INSTALLER_SHA256}"
