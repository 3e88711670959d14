# The coordinator: lorm-server (and lorm-health, lorm-certs). CPU only; no dataset, no model weights.
# Build from the repository root:  docker build -f deploy/coordinator.Dockerfile -t lorm-coordinator .
# PYTHON_BASE: any image with python3 and its venv module (a Debian-based one: useradd below).
ARG PYTHON_BASE=python:3.12-slim
FROM ${PYTHON_BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# A private mirror or wheel folder for builds without PyPI (pip reads these; unset by default),
# e.g. --network host --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=http://127.0.0.1:8765/
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
ARG PIP_TRUSTED_HOST
# A venv, so that the base's own Python packages (or a Debian "externally managed" Python) do not matter.
RUN python3 -m venv /opt/venv

WORKDIR /opt/lorm
# The coordinator only merges tensors: the CPU build of torch keeps the image small.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --index-url "$TORCH_INDEX" "torch==2.14.1" "torchvision==0.29.1"
COPY pyproject.toml README.md ./
COPY common ./common
COPY server ./server
COPY client ./client
COPY engine ./engine
COPY proto ./proto
RUN pip install . && rm -rf /opt/lorm/build

# A fixed non-root user (numeric, so Kubernetes' runAsNonRoot can verify it) in group 0, with
# a home and caches it can write: matplotlib, torch and the hub write there, and a read-only
# or missing home makes them fail at the first plot or download. Group 0 owns and may write
# every writable path, so an orchestrator that picks another uid (OpenShift) still works.
ARG LORM_UID=10001
ENV HOME=/home/lorm XDG_CACHE_HOME=/home/lorm/.cache MPLCONFIGDIR=/home/lorm/.cache/matplotlib \
    HF_HOME=/home/lorm/.cache/huggingface TORCH_HOME=/home/lorm/.cache/torch
RUN useradd --uid "$LORM_UID" --gid 0 --home-dir /home/lorm --create-home --shell /usr/sbin/nologin lorm \
 && mkdir -p /state /results /home/lorm/.cache/matplotlib \
 && chown -R "$LORM_UID":0 /state /results /home/lorm \
 && chmod -R g=u /state /results /home/lorm
USER 10001:0
WORKDIR /home/lorm
VOLUME ["/state", "/results"]

# gRPC (clients dial in) and Prometheus /metrics.
EXPOSE 50051 9100
# The entry point is the command-line program itself: `docker run IMAGE --help` is `lorm-server --help`.
ENTRYPOINT ["lorm-server"]
# The default: the demo run, TLS files mounted at /run/secrets (deploy/compose.yaml).
CMD ["--preset", "demo", "--state-dir", "/state", "--results-dir", "/results", "--host", "0.0.0.0", \
     "--port", "50051", "--metrics-port", "9100", "--tls-ca", "/run/secrets/ca.crt", \
     "--tls-cert", "/run/secrets/coordinator.crt", "--tls-key", "/run/secrets/coordinator.key", \
     "--allowed-clients", "client-0,client-1,client-2", "--model-spec", "/run/secrets/model-spec.json"]
