#!/usr/bin/env bash
# A crash drill for the compose stack: the demo run once without faults, then again with the
# coordinator's process SIGKILLed from the host mid-run (as the OOM killer would). Docker's
# restart policy brings the container back, the coordinator resumes from its state volume, and
# the two runs' adapters, heads and accuracy counts must be bit-identical.
#   bash deploy/build-and-run.sh          # first: images and deploy/certs
#   bash deploy/crash-drill.sh            # then the drill; exit 0 only if the results are identical
# Environment: LORM_DATA as for build-and-run.sh; LORM_KILL_AFTER, the coordinator log line after
# which to kill it (default "task 1 round 1 train A merged").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$here"
export LORM_DATA="${LORM_DATA:-$(cd "$root/.." && pwd)/shared/datasets}"
kill_after="${LORM_KILL_AFTER:-task 1 round 1 train A merged}"
compose=(docker compose -f compose.yaml)
out="$root/runs/crash-drill-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

if ! docker image inspect lorm-coordinator:latest lorm-client:latest >/dev/null 2>&1 || [ ! -f certs/ca.crt ]; then
    echo "crash-drill: run 'bash deploy/build-and-run.sh' first (it builds the images and deploy/certs)." >&2
    exit 2
fi
trap '"${compose[@]}" down -v >/dev/null 2>&1 || true' EXIT

# One run of the demo; $1 names it; with $2, the coordinator is killed after that log line.
run() {
    local name="$1" line="${2:-}" id pid t0
    "${compose[@]}" down -v >/dev/null 2>&1 || true
    t0=$(date +%s)
    "${compose[@]}" up --no-build --detach --quiet-pull >/dev/null 2>&1
    id="$("${compose[@]}" ps --all --quiet coordinator)"
    if [ -n "$line" ]; then
        for _ in $(seq 1 300); do  # at most 10 minutes
            docker logs "$id" 2>&1 | grep -qF "$line" && break
            sleep 2
        done
        docker logs "$id" 2>&1 | grep -qF "$line" || { echo "crash-drill: never saw '$line'" >&2; exit 1; }
        pid="$(docker top "$id" -eo pid,args | awk '/lorm-server/ && !/docker-init/ {print $1; exit}')"
        echo "[crash-drill] $name: SIGKILL to lorm-server (host pid $pid) after '$line'"
        kill -9 "$pid"
        # `docker wait` returns when the killed process exits, before the restart policy acts:
        # wait for the restart, then for the restarted coordinator.
        for _ in $(seq 1 60); do
            [ "$(docker inspect "$id" --format '{{.RestartCount}}')" -ge 1 ] && break
            sleep 1
        done
    fi
    timeout 1200 docker wait "$id" >/dev/null
    [ "$(docker inspect "$id" --format '{{.State.Status}}')" = exited ] || { echo "crash-drill: $name did not end" >&2; exit 1; }
    echo "[crash-drill] $name: exit $(docker inspect "$id" --format '{{.State.ExitCode}}'), restarts" \
         "$(docker inspect "$id" --format '{{.RestartCount}}'), $(( $(date +%s) - t0 )) s;" \
         "$(docker logs "$id" 2>&1 | grep -E 'resumed run|FAA \(mean' | tr -s ' ' | paste -sd ';' -)"
    "${compose[@]}" cp coordinator:/results "$out/$name" >/dev/null 2>&1 || {
        echo "crash-drill: could not copy $name's results out of the coordinator" >&2; exit 1; }
}

run clean
run crashed "$kill_after"

echo "[crash-drill] comparing $out/clean with $out/crashed"
docker run --rm -i --network none --user "$(id -u):$(id -g)" -v "$out:/runs:ro" --entrypoint python lorm-coordinator:latest - <<'EOF'
import json
import sys

from safetensors.torch import load_file

same = True
for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
    a, b = load_file("/runs/clean/" + name), load_file("/runs/crashed/" + name)
    equal = a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    print(f"  {name}: {len(a)} tensors, " + ("bit-identical" if equal else "DIFFERENT"))
    same = same and equal
clean, crashed = (json.load(open(f"/runs/{n}/metrics.json")) for n in ("clean", "crashed"))
counts = clean["correct"] == crashed["correct"] and clean["total"] == crashed["total"]
print("  accuracy counts: " + ("identical" if counts else "DIFFERENT") + f" (FAA {clean['faa']:.2f} / {crashed['faa']:.2f})")
sys.exit(0 if same and counts else 1)
EOF
