#!/usr/bin/env bash
# Builds the Dockerfile's `cuda` target (CUDA 13.0 and cuDNN 9 from NVIDIA's PyPI wheels on the CPU image's
# Debian base) and checks it on a machine without a GPU, which is what can be checked here:
#   - the image's size, its health check on /readyz, and the CUDA libraries in /opt/cuda/lib;
#   - with JOINTSPACE_DEVICE=auto it serves on the CPU: /readyz 200 naming the cpu provider, /metrics likewise,
#     and the log's warning saying why CUDA cannot be used;
#   - with the image's own JOINTSPACE_DEVICE=cuda it refuses to start, saying that CUDA cannot be used and
#     why (no GPU, no driver library).
# Slow (the first build downloads about 1.2 GB of wheels and writes a 2 GB image), so not part of
# scripts/test.sh: docs/operations.md, "Container".
#
#   scripts/cuda-image-smoke.sh                 # podman (here: source /tmp/container-sandbox/env.sh first) or docker
#   SKIP_BUILD=1 scripts/cuda-image-smoke.sh    # check an image already built
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh disable=SC1091
source scripts/lib.sh
ENGINE=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
IMAGE=${IMAGE:-jointspace:cuda-smoke}
PORT=${PORT:-18081}
NAME=jointspace-cuda-smoke-$$
fail() { echo "cuda-image-smoke: FAIL: $*" >&2; "$ENGINE" logs "$NAME" 2>&1 | tail -40 >&2 || true; exit 1; }
cleanup() { "$ENGINE" rm -f "$NAME" "$NAME-cuda" >/dev/null 2>&1 || true; }
trap cleanup EXIT

default_bundle_built || scripts/setup-python.sh
if [[ -z "${SKIP_BUILD:-}" ]]; then
  fmt=(); [[ "$ENGINE" == podman ]] && fmt=(--format docker)   # keeps HEALTHCHECK (OCI has none)
  t=$SECONDS
  nice -n 10 "$ENGINE" build "${fmt[@]}" --target cuda -t "$IMAGE" . || fail "the cuda target did not build"
  echo "cuda-image-smoke: image $IMAGE built in $((SECONDS - t)) s"
fi
"$ENGINE" image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "cuda-image-smoke: image size %.0f MB\n", $1/1e6}'
hc=$("$ENGINE" image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}' 2>/dev/null || true)
[[ "$hc" == *readyz* ]] || fail "the image has no health check on /readyz (got: $hc)"
libs=$("$ENGINE" run --rm --entrypoint /bin/sh "$IMAGE" -c 'cd /opt/cuda/lib && ls && du -sh . | cut -f1')
echo "cuda-image-smoke: /opt/cuda/lib: $(paste -sd" " - <<<"$libs")"
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudnn.so.9 libnvrtc.so.13; do
  grep -qx "$l" <<<"$libs" || fail "$l is not in /opt/cuda/lib"
done
# Every library the CUDA provider links resolves inside the image, but the driver's libcuda.so.1 (mounted by the
# NVIDIA container runtime where there is a GPU).
missing=$("$ENGINE" run --rm --entrypoint /bin/sh "$IMAGE" -c \
  'ldd /opt/onnxruntime/lib/libonnxruntime_providers_cuda.so /opt/cuda/lib/libcudnn*.so.9 | grep "not found" | sort -u')
echo "cuda-image-smoke: not found in the image: ${missing:-nothing}"
! grep -v -e libcuda.so.1 -e "^$" <<<"$missing" | grep -q . || fail "libraries missing from the image: $missing"

# --device auto (the variable, as a deployment sets it): serves on the CPU, saying why not CUDA.
"$ENGINE" run -d --name "$NAME" -p "127.0.0.1:$PORT:8080" -e JOINTSPACE_DEVICE=auto "$IMAGE" >/dev/null
base=http://127.0.0.1:$PORT
t=$SECONDS
running() { "$ENGINE" inspect "$NAME" --format '{{.State.Running}}' | grep -q true; }
wait_ready "$base" 180 running || fail "the server did not become ready with JOINTSPACE_DEVICE=auto"
ready=$(curl -fsS "$base/readyz")
echo "cuda-image-smoke: ready in $((SECONDS - t)) s with JOINTSPACE_DEVICE=auto: $ready"
[[ "$ready" == *'"execution_provider":"cpu"'* ]] || fail "/readyz does not name the cpu provider: $ready"
curl -fsS "$base/metrics" | grep -qx 'jointspace_execution_provider{provider="cpu"} 1' \
  || fail "/metrics does not say the cpu provider runs"
warn=$("$ENGINE" logs "$NAME" 2>&1 | grep -m1 'CUDA cannot be used' || true)
[[ -n "$warn" ]] || fail "no warning in the log saying why CUDA is not used"
echo "cuda-image-smoke: the log says: $(cut -c1-400 <<<"$warn")"
"$ENGINE" stop -t 30 "$NAME" >/dev/null

# The image's default, JOINTSPACE_DEVICE=cuda, without a GPU: exits at start, saying why.
set +e
"$ENGINE" run --name "$NAME-cuda" "$IMAGE" >/dev/null 2>&1
rc=$?
set -e
out=$("$ENGINE" logs "$NAME-cuda" 2>&1)
[[ $rc != 0 ]] || fail "JOINTSPACE_DEVICE=cuda without a GPU: the server did not refuse to start"
msg=$(grep -m1 -o 'cannot use the CUDA execution provider.*' <<<"$out" || true)
[[ -n "$msg" ]] || fail "JOINTSPACE_DEVICE=cuda: exit $rc without the reason: $(tail -n 3 <<<"$out")"
echo "cuda-image-smoke: JOINTSPACE_DEVICE=cuda without a GPU: exit $rc, $(cut -c1-500 <<<"$msg")"
echo "cuda-image-smoke: PASS"
