# Meridian: one image for every component. The manifests in deploy/ run it as
#   meridian global-scheduler | meridian autoscaler ...          (the `meridian` entry point)
#   python -m regional_scheduler.kube_cli | python -m node_agent  (one component's imports only)
# Build:  docker build -t meridian:latest .      (docs/deploy.md; CI lints this file, it does not build it)
#
# Two stages: the first installs Meridian and its dependencies into a virtual environment (CPU-only
# torch from PyTorch's CPU index: the default wheel carries CUDA libraries no component uses); the second
# is a clean python:3.11-slim with that environment copied in, no compilers or pip caches, run as a
# non-root user.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/meridian \
    PATH=/opt/meridian/bin:$PATH
# torch first, CPU-only, at the version pyproject.toml pins; `pip install .` then finds it satisfied.
RUN python -m venv /opt/meridian \
    && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY meridian ./meridian
COPY meridian_demo ./meridian_demo
COPY node_agent ./node_agent
COPY regional_scheduler ./regional_scheduler
COPY global_scheduler ./global_scheduler
COPY gnn ./gnn
COPY protos ./protos
RUN pip install --no-cache-dir . \
    && python -c "import torch; assert not torch.cuda.is_available() and '+cpu' in torch.__version__, torch.__version__"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="meridian" \
      org.opencontainers.image.description="Meridian: hierarchical multi-cluster scheduling for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/meridian \
    PATH=/opt/meridian/bin:$PATH
# A user of its own, no login, no home; the manifests also set runAsNonRoot and their own uid (the
# environment is root-owned and world-readable, so any uid runs it, none can change it).
RUN groupadd --system --gid 10001 meridian \
    && useradd --system --uid 10001 --gid meridian --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin meridian
COPY --from=build /opt/meridian /opt/meridian
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["meridian"]
CMD ["--help"]
