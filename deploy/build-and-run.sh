#!/usr/bin/env bash
# Build both images and run the compose demo (one coordinator, N clients, mutual TLS), then copy
# the results out. Needs a Docker engine with compose v2 (docker compose version).
#   bash deploy/build-and-run.sh                 # 3 clients, CPU
#   LORM_CLIENTS=5 bash deploy/build-and-run.sh  # 5 clients (writes deploy/compose.5.yaml)
#   LORM_GPU=1 bash deploy/build-and-run.sh      # one GPU per client (NVIDIA container toolkit)
# Environment: LORM_DATA (datasets folder holding clinc150/, default ../shared/datasets beside the
# repository), LORM_PRESET (default demo), LORM_LOG_FORMAT (plain|json), LORM_BUILD_ARGS (more
# `docker build` options, e.g. other base images or a wheel mirror for a build without PyPI:
#   LORM_BUILD_ARGS="--network host --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=http://127.0.0.1:8765/
#                    --build-arg PYTHON_BASE=my/python:3.11 --build-arg CUDA_BASE=my/cuda-base"
# with the wheels served by `python3 -m http.server --bind 127.0.0.1 8765 -d WHEELS`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$here"

if ! command -v docker >/dev/null 2>&1; then
    echo "build-and-run: no docker CLI on this machine; install Docker (engine + compose v2) to run the images." >&2
    exit 3
fi
if ! docker info >/dev/null 2>&1; then
    echo "build-and-run: the docker CLI cannot reach a Docker engine (is dockerd running, is DOCKER_HOST set?)." >&2
    echo "build-and-run: without an engine, the same commands run as processes: see docs/OPERATIONS.md." >&2
    exit 3
fi
if ! docker compose version >/dev/null 2>&1; then
    echo "build-and-run: 'docker compose' (compose v2) is missing." >&2
    exit 3
fi

clients="${LORM_CLIENTS:-3}"
py="$(command -v python3 || command -v python)"
files=(-f compose.yaml)
if [ "$clients" != 3 ]; then
    "$py" compose_gen.py --clients "$clients" > "compose.$clients.yaml"
    files=(-f "compose.$clients.yaml")
fi
if [ "${LORM_GPU:-0}" = 1 ]; then
    "$py" compose_gen.py --clients "$clients" --gpu > "compose.gpu.$clients.yaml"
    files+=(-f "compose.gpu.$clients.yaml")
fi
export LORM_DATA="${LORM_DATA:-$(cd "$root/.." && pwd)/shared/datasets}"
if [ ! -d "$LORM_DATA/clinc150" ] && [ "${LORM_PRESET:-demo}" = demo ]; then
    echo "build-and-run: the demo needs $LORM_DATA/clinc150 (set LORM_DATA to a folder that holds clinc150/)." >&2
    exit 2
fi

echo "[build-and-run] building lorm-coordinator and lorm-client"
read -r -a build_args <<< "${LORM_BUILD_ARGS:-}"
docker build "${build_args[@]}" -f coordinator.Dockerfile -t lorm-coordinator:latest "$root"
docker build "${build_args[@]}" -f client.Dockerfile -t lorm-client:latest "$root"

if [ ! -f "certs/clients/client-$((clients - 1)).crt" ] || [ ! -f certs/clients/health.crt ]; then
    ids="$(seq -s, -f 'client-%g' 0 $((clients - 1))),health"
    echo "[build-and-run] development certificates in deploy/certs for $ids"
    mkdir -p certs
    # Run as the invoking user so that the files are theirs; lorm-certs needs no home.
    docker run --rm --user "$(id -u):$(id -g)" -v "$here/certs:/certs" --entrypoint lorm-certs \
        lorm-coordinator:latest --out /certs --clients "$ids" --hosts coordinator,localhost,127.0.0.1 --force
    # Compose passes file secrets as bind mounts with the host's owner and mode, and the
    # containers run as uid 10001: make the development keys readable to it. Production:
    # files owned by uid 10001 (mode 0400), or Kubernetes secrets with fsGroup (deploy/k8s).
    chmod 0644 certs/*.key certs/clients/*.key
fi

echo "[build-and-run] the run's model description (lorm-spec) in deploy/model-spec.json"
# Written where the data is, by the client image (the coordinator builds no model and reads no data); the
# coordinator holds every client's Describe to it (--model-spec).
docker run --rm --user "$(id -u):$(id -g)" -v "$LORM_DATA:/data:ro" -v "$here:/out" -e LORM_DATA_DIR=/data \
    -e HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" -e HOME=/tmp -e HF_HOME=/tmp/hf -e XDG_CACHE_HOME=/tmp \
    -e MPLCONFIGDIR=/tmp --entrypoint lorm-spec lorm-client:latest \
    --preset "${LORM_PRESET:-demo}" --set num_clients="$clients" --out /out/model-spec.json

echo "[build-and-run] running the demo: docker compose ${files[*]} up"
docker compose "${files[@]}" up --no-build --detach
# Not `up --exit-code-from coordinator`: that stops everything when the first client exits,
# while the coordinator still lingers; wait for the coordinator alone instead.
docker compose "${files[@]}" logs --follow &
logs=$!
trap 'kill "$logs" 2>/dev/null || true' EXIT
rc="$(docker wait "$(docker compose "${files[@]}" ps --all --quiet coordinator)")"
kill "$logs" 2>/dev/null || true
echo "[build-and-run] the coordinator exited with $rc"
mkdir -p "$root/runs"
out="$root/runs/compose-$(date +%Y%m%d-%H%M%S)"
docker compose "${files[@]}" cp coordinator:/results "$out" && echo "[build-and-run] results in $out"
echo "[build-and-run] remove containers and volumes: docker compose ${files[*]} down -v"
exit "$rc"
