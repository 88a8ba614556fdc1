# syntax=docker/dockerfile:1
#
# One image for the operator, the router, the pre-pull Jobs and the engine: `folio <command>`.
#
#   docker build -t folio:dev .                              # CUDA (default): GPU nodes
#   docker build --build-arg VARIANT=cpu -t folio:dev-cpu .  # slim CPU build: kind, CI, `folio up`
#
# No model weights are baked in: engines read them from the pre-pulled cache volume.

# cuda | cpu
ARG VARIANT=cuda
ARG PYTHON_VERSION=3.12
# The CUDA "base" flavour only sets up driver access (the NVIDIA container toolkit mounts the
# driver); PyTorch's wheels bring their own CUDA libraries.
ARG CUDA_BASE=nvidia/cuda:12.8.1-base-ubuntu24.04
ARG TORCH_VERSION=2.13.0

# ---------------------------------------------------------------------------- bases
# Each variant's runtime base; build and runtime stages share it so the venv's interpreter path holds.

FROM ${CUDA_BASE} AS base-cuda
# Triton compiles small C launchers at run time, so the CUDA runtime keeps a C compiler and the
# Python headers. Ubuntu 24.04's python3 is 3.12.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# PyPI's Linux torch wheels are the CUDA builds.
ENV TORCH_INDEX_URL=https://pypi.org/simple

FROM python:${PYTHON_VERSION}-slim AS base-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM base-${VARIANT} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# ---------------------------------------------------------------------------- build

FROM base AS build
ARG TORCH_VERSION
# A C compiler for the engine's CPU kernels (kernels/csrc, plain C extensions); the CUDA base
# already has one. Only this stage gets it: the runtime copies the built venv.
RUN command -v gcc >/dev/null || (apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*)
RUN python3 -m venv /opt/folio
ENV PATH=/opt/folio/bin:$PATH
# torch first, from the variant's index, in its own layer: it is most of the image and changes least.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# Then the project as a regular (non-editable) wheel install; only what the build needs is copied
# (see .dockerignore), so edits to tests or docs do not invalidate this layer.
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY operator ./operator
COPY engine ./engine
COPY kernels ./kernels
RUN pip install . \
 && pip check \
 && folio --version \
 && python -c "from folio.kernels import decode_attention_cpu as d, fused_cpu as f; assert d.AVAILABLE and f.AVAILABLE, 'CPU kernels not built'"

# ---------------------------------------------------------------------------- runtime

FROM base AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="folio" \
      org.opencontainers.image.description="Folio: operator, router and paged-attention engine for LLM inference on Kubernetes" \
      org.opencontainers.image.source="https://github.com/folio-dev/folio" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.folio.variant="${VARIANT}"
COPY --from=build /opt/folio /opt/folio
# A fixed non-root user (65532, as distroless' "nonroot") that pods' runAsUser can match.
# Its home is /tmp: the chart mounts /tmp writable and keeps the root filesystem read-only.
RUN groupadd --system --gid 65532 folio \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin folio
ENV PATH=/opt/folio/bin:$PATH \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface \
    TRITON_CACHE_DIR=/tmp/triton \
    XDG_CACHE_HOME=/tmp/.cache
USER 65532:65532
WORKDIR /tmp
EXPOSE 8000 8080
ENTRYPOINT ["folio"]
CMD ["--help"]
