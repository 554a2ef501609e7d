# One image for every migsched service (docker-compose.yml picks the entry point per container):
#   python -m services.balancer | services.registry | services.migration_planner | services.executor
# It installs what the control plane and the sim executor run. A GPU node's executor adds NVML's binding
# (docker build --build-arg EXTRAS=fast,nvml .) and needs the NVIDIA container runtime (--gpus all) and root for
# MIG reconfiguration. The simulator's plots (sim) and the load tools (load) are extras of their own.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY migsched ./migsched
COPY load ./load
ARG EXTRAS=fast
RUN pip install --no-cache-dir --prefix=/install ".[${EXTRAS}]"

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /install /usr/local
# the services run unprivileged; an nvml executor overrides the user (MIG operations need root)
RUN useradd --system --uid 10001 --home-dir /var/lib/migsched --create-home migsched
USER migsched
WORKDIR /var/lib/migsched
EXPOSE 9101 9102 9103 9104
CMD ["migsched", "--help"]
