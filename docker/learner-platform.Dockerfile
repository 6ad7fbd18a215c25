# syntax=docker/dockerfile:1
# The learner image of the `platform` runtime (the `tensorflow` frameworks): the learner
# wrapper and TensorFlow CPU from pyproject's `tensorflow` extra, in one environment.
# Build from the repository root:
#   docker build -f docker/learner-platform.Dockerfile -t dlaas/learner-platform .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/dlaas/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY worker ./worker
COPY dlaas ./dlaas
COPY composition ./composition
RUN /opt/dlaas/venv/bin/pip install ".[tensorflow]"

FROM python:${PYTHON_VERSION}-slim-bookworm AS learner
RUN groupadd --gid 1000 dlaas \
    && useradd --uid 1000 --gid 1000 --home-dir /home/dlaas --create-home \
       --shell /bin/bash dlaas
COPY --from=build /opt/dlaas/venv /opt/dlaas/venv
ENV PATH=/opt/dlaas/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /home/dlaas
# One learner: `python -I -m worker.learner SPEC.json HOST.json` (fetch, run, store).
ENTRYPOINT ["python", "-I", "-m", "worker.learner"]
