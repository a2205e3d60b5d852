# The seed recipe's training image: radixark/miles v0.1.0, pinned by digest, with the AWS EFA
# installer added (the recipe's stack.source: "radixark/miles v0.1.0 (amd64 digest sha256:45ae...)
# with EFA 1.49 added"). The digest below is the base's; an image built from this file has its own
# digest, which a recipe must then name in stack.image.
#
#   docker build -t <registry>/miles:v0.1.0-efa1.49 .
#
# Not built by the test suite: it needs Docker Hub and AWS's download site, which tests never reach.
ARG BASE=radixark/miles@sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca
FROM ${BASE}

ARG EFA_INSTALLER_VERSION=1.49.0
# libfabric + aws-ofi-nccl in user space only: the kernel module belongs to the host (the DLAMI has it).
RUN set -eux; \
    cd /tmp; \
    curl -fsSLO "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"; \
    tar xzf "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"; \
    cd aws-efa-installer; \
    ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify; \
    cd /; rm -rf /tmp/aws-efa-installer*

# The launcher's node-side programs (preflight, stack probe, rollout function); at run time the
# launcher mounts the current ones over this copy.
COPY scripts/ /opt/reproduce/scripts/
ENV PYTHONPATH=/root/miles:/root/Megatron-LM:/opt/reproduce/scripts
