#!/usr/bin/env bash
# Device call 1 of 2 (bench/device/README.md): keep part a of the carried MiniLM tar in .devkept/ (git-ignored, so it
# stays on the warm machine for call 2), and print what the host holds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .devkept && cp .devcarry/a/minilm.tar.0 .devkept/
nvidia-smi -L || true  # a probe: nothing below stops the call
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" || true
python3 -m pip list 2>/dev/null | grep -i -E "^(grpcio|protobuf|transformers|timm|torchvision|numpy|safetensors|cryptography) " || true
ls -l .devkept
