#!/usr/bin/env bash
# The GPU check, in one call on a remote GPU machine that only the checkout travels to (docs/benchmarks.md,
# "GPU"): joins
# the parts scripts/gpu-prepare.sh staged in .cache/gpu/, checks them, and measures the CUDA provider through
# `jointspace serve --device cuda`:
#   - the device, its driver, the CUDA / cuDNN libraries found in python3's site-packages, ONNX Runtime;
#   - every server's /readyz and /metrics naming the provider;
#   - parity: the codes and vectors of the staged Flickr8k test photos against the CPU reference, for the
#     default bundle, EfficientNet-Lite2 and both windowed copies;
#   - ingest photos/s with --max-batch-crops 1, 16, 64, 256 (VGG16 ten crops, VGG16 windowed,
#     EfficientNet-Lite2 windowed), concurrent clients posting batches of photos, after a warm-up;
#   - sentence search p50/p99 at 200 and 1,000 req/s (open loop) on a seeded collection;
#   - with 1,000 staged photos (GPU_PHOTOS=1000 at prepare time), `jointspace eval` of the test split on CUDA.
# Results in $OUT (the runner brings that folder back; here target/gpu-check): gpu-check.log,
# results.jsonl (one JSON object a step), gpu-check.json (those and the tables as markdown), server-logs.tar.gz.
#
#   bash scripts/gpu-check.sh              # there, in the last call (the parts carried by the calls before)
#   bash scripts/gpu-check.sh --receive K  # there, in call K < last: checks part K arrived whole
#   scripts/gpu-check.sh --dry-run         # here: the same steps on the CPU (.venv's onnxruntime, --device cpu),
#                                          # with smaller counts and shorter runs
# Knobs: GPU_BUDGET_S (450 there: the steps left when it runs out are skipped and say so), GPU_STAGE, GPU_WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=gpu RECEIVE=
case "${1:-}" in
  --dry-run) MODE=dry ;;
  --receive) RECEIVE=${2:?--receive needs the call number} ;;
  "") ;;
  *) echo "gpu-check: unknown argument $1 (none, --dry-run or --receive K)" >&2; exit 2 ;;
esac

# The staged parts: .cache/gpu of this checkout (there), or of the main worktree (a dry run from another one).
STAGE=${GPU_STAGE:-$ROOT/.cache/gpu}
if ! compgen -G "$STAGE/call*/parts.sha256" >/dev/null; then
  main=$(git worktree list --porcelain 2>/dev/null | awk 'NR == 1 { print $2 }' || true)
  [[ -n "$main" ]] && STAGE=$main/.cache/gpu
fi
die() { echo "gpu-check: FAIL: $*" >&2; exit 1; }
compgen -G "$STAGE/call*/parts.sha256" >/dev/null || die "no staged parts under $STAGE (scripts/gpu-prepare.sh)"

if [[ -n "$RECEIVE" ]]; then
  d=$STAGE/call$RECEIVE
  [[ -d "$d" ]] || die "$d did not arrive (carry [\".cache/gpu/call$RECEIVE\"])"
  (cd "$STAGE" && grep " call$RECEIVE/" "call$RECEIVE/parts.sha256" | sha256sum -c --quiet -) \
    || die "part $RECEIVE arrived damaged: send it again"
  echo "gpu-check: part $RECEIVE of $(wc -l < "$d/parts.sha256") is here and whole ($(du -sb "$d" | cut -f1) bytes)"
  if (( RECEIVE == 1 )); then   # the first call also says what the machine is, for free
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>&1 || true)
    echo "python3's site-packages: $site; CUDA's libraries there: $(compgen -G "$site/nvidia/*/lib" | paste -sd' ' - || true)"
  fi
  exit 0
fi

OUTDIR=${OUT:-$ROOT/target/gpu-check}
mkdir -p "$OUTDIR"
W=${GPU_WORK:-/tmp/jointspace-gpu-check}
rm -rf "$W" && mkdir -p "$W/logs" "$W/db"
exec > >(tee "$OUTDIR/gpu-check.log") 2>&1
RESULTS=$OUTDIR/results.jsonl
: > "$RESULTS"
say() { echo "gpu-check [$(date -u +%T) +${SECONDS}s]: $*"; }

if [[ $MODE == gpu ]]; then
  BUDGET=${GPU_BUDGET_S:-450} PY=python3 DEVICE=cuda PROVIDER=cuda
  PARITY_N=0 WARM_S=2 TIMED_S=6 PER_REQUEST=8 MAX_C=32
  SEARCH_N=${GPU_SEARCH_N:-10000} RATES=(200 1000) SEARCH_S=10
else
  BUDGET=${GPU_BUDGET_S:-1500} PY=$ROOT/.venv/bin/python DEVICE=cpu PROVIDER=cpu
  PARITY_N=4 WARM_S=1 TIMED_S=3 PER_REQUEST=1 MAX_C=2
  SEARCH_N=${GPU_SEARCH_N:-2000} RATES=(20 50) SEARCH_S=3
fi
left() { echo $((BUDGET - SECONDS)); }
# record STEP JSON...: one result line, tagged with its step (the JSON objects are merged, later keys win).
record() {
  local step=$1; shift
  "$PY" -c 'import json, sys
r = {"step": sys.argv[1]}
for a in sys.argv[2:]:
    r.update(json.loads(a))
print(json.dumps(r))' "$step" "$@" | tee -a "$RESULTS"
}
jstr() { "$PY" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }
finish() {
  local rc=$?
  stop_server
  "$PY" scripts/gpu_check.py report "$RESULTS" --out "$OUTDIR/gpu-check.json" >/dev/null 2>&1 || true
  tar -C "$W" -czf "$OUTDIR/server-logs.tar.gz" logs 2>/dev/null || true
  say "done in ${SECONDS} s (exit $rc); results in $OUTDIR"
}
SERVER_PID=
stop_server() {
  if [[ -n "$SERVER_PID" ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap finish EXIT

# The tools a bare machine may lack, done with Python's standard library instead (GPU_FALLBACKS=1 forces them).
unxz_to_stdout() {
  if command -v xz >/dev/null && [[ -z "${GPU_FALLBACKS:-}" ]]; then
    xz -d -c "$1"
  else
    "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer, 1 << 20)' "$1"
  fi
}
if ! command -v curl >/dev/null || [[ -n "${GPU_FALLBACKS:-}" ]]; then
  say "no curl here: GET requests through Python's urllib"
  curl() { # only what this script and scripts/lib.sh use: curl -fsS URL
    "$PY" -c 'import sys, urllib.request
try:
    sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=10).read())
except Exception as e:
    print(f"curl (urllib): {e}", file=sys.stderr)
    sys.exit(22)' "${@: -1}"
  }
fi

# 1. The payload: every part there and whole, the whole's sha256, every file's.
say "mode $MODE, stage $STAGE, work $W, budget ${BUDGET} s"
mapfile -t parts < <(awk '{ print $2 }' "$(compgen -G "$STAGE/call*/parts.sha256" | sed -n 1p)")
for p in "${parts[@]}"; do
  [[ -f "$STAGE/$p" ]] || die "$p is missing: its call did not run on this machine, or the machine was given back in between (${#parts[@]} parts, one per call)"
done
want=$(cut -d' ' -f1 "$(compgen -G "$STAGE/call*/payload.sha256" | sed -n 1p)")
got=$(cd "$STAGE" && cat "${parts[@]}" | tee "$W/payload.tar" | sha256sum | cut -d' ' -f1)
[[ "$got" == "$want" ]] || die "the joined payload's sha256 is $got, not $want: a part is damaged"
tar -C "$W" -xf "$W/payload.tar" || die "unpacking the payload failed"
rm -f "$W/payload.tar"
for x in gpu-ort gpu-rest; do
  unxz_to_stdout "$W/$x.tar.xz" | tar -C "$W" -xf - || die "unpacking $x.tar.xz failed"
  rm -f "$W/$x.tar.xz"
done
G=$W/gpu
(cd "$G" && sha256sum -c --quiet MANIFEST.sha256) || die "a file of the payload differs from its MANIFEST.sha256"
say "payload: ${#parts[@]} parts joined, sha256 $got, $(wc -l < "$G/MANIFEST.sha256") files checked"
# A server built after the payload (carried alone in .cache/gpu/bin, one call of its own) replaces the staged one.
if [[ -x $STAGE/bin/jointspace ]]; then
  cp "$STAGE/bin/jointspace" "$G/bin/jointspace"
  say "server binary from $STAGE/bin: sha256 $(sha256sum "$G/bin/jointspace" | cut -d' ' -f1)"
fi
BIN=$G/bin/jointspace BENCH=$G/bin/bench PHOTOS=$G/photos/images LIST=$G/photos/list.txt
n_photos=$(wc -l < "$LIST")
(( PARITY_N > 0 )) || PARITY_N=$n_photos

# 2. The libraries and the machine.
GPU_ORT=$G/ort/libonnxruntime.so.1.31.1
if [[ $MODE == gpu ]]; then
  # CUDA 13's wheels install to nvidia/cu13/lib, cuDNN's to nvidia/cudnn/lib; PyTorch's own folder and a CUDA
  # toolkit's come after them, in case the machine's image differs from what KINDS.md describes.
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  libdirs=$( { compgen -G "$site/nvidia/*/lib" || true; compgen -G "$site/torch/lib" || true
               compgen -G "/usr/local/cuda/lib64" || true; } | paste -sd: -)
  [[ -n "$libdirs" ]] || die "no nvidia/*/lib under $site: where are CUDA's libraries? ($PY is $(command -v "$PY"))"
  for l in libcudart.so.13 libcublasLt.so.13 libcudnn.so.9; do
    found=$(tr : '\n' <<<"$libdirs" | while read -r d; do [[ -e "$d/$l" ]] && { echo "$d/$l"; break; }; done)
    say "$l: ${found:-NOT FOUND in $libdirs}"
  done
  export LD_LIBRARY_PATH=$G/ort:$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ORT_DYLIB_PATH=$GPU_ORT
else
  # shellcheck source=scripts/lib.sh disable=SC1091
  source scripts/lib.sh
  ORT_DYLIB_PATH=
  ort_dylib   # .venv's CPU onnxruntime
fi
say "ORT_DYLIB_PATH=$ORT_DYLIB_PATH"
say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null || echo "no nvidia-smi: no GPU")
nvidia-smi 2>/dev/null | head -n 12 || true
unresolved=$(LD_LIBRARY_PATH=$G/ort:${LD_LIBRARY_PATH:-} ldd "$G/ort/libonnxruntime_providers_cuda.so" 2>&1 | grep 'not found' | awk '{ print $1 }' | paste -sd' ' - || true)
say "the CUDA provider's libraries not found: ${unresolved:-none}"
versions=$("$PY" - <<'EOF'
import importlib.metadata as md, json, platform
names = ["nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-curand", "nvidia-cufft",
         "nvidia-cuda-nvrtc", "cuda-toolkit", "torch", "onnxruntime"]
v = {}
for n in names:
    try:
        v[n] = md.version(n)
    except md.PackageNotFoundError:
        v[n] = None
print(json.dumps({"python": platform.python_version(), "packages": v}))
EOF
)
meta=$(cat "$G/meta.json")
record environment "{\"mode\": \"$MODE\", \"device\": $(jstr "$smi"), \"cpus\": $(nproc), \"kernel\": $(jstr "$(uname -r)"),
  \"ort_library\": $(jstr "$(basename "$ORT_DYLIB_PATH")"), \"cuda_provider_unresolved\": $(jstr "${unresolved:-}"),
  \"server\": $(jstr "$("$BIN" --version)")}" "$versions" "{\"payload\": $meta}"

# start_server NAME BUNDLE [serve flags...]: starts it, waits for /readyz, checks the provider in /readyz and
# /metrics; returns 1 (the log's tail printed) when it does not get there. Sets SERVER_PID, URL, READY_S.
PORT=28600
start_server() {
  local name=$1 bundle=$2; shift 2
  local log=$W/logs/$name.log t0=$SECONDS
  PORT=$((PORT + 1)) URL=http://127.0.0.1:$((PORT))
  "$BIN" serve --addr "127.0.0.1:$PORT" --bundle "$G/models/$bundle" --device "$DEVICE" \
    --database-url "sqlite://$W/db/$name.db" --snapshot-interval 0 "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  local t
  t=$(date +%s.%N)
  if ! wait_ready "$URL" 300 kill -0 "$SERVER_PID"; then
    tail -n 15 "$log"
    stop_server
    START_ERROR=$(grep -m1 -iE 'error|cannot|refus' "$log" | cut -c1-600 || tail -n 1 "$log")
    return 1
  fi
  READY_S=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  local ready metrics
  ready=$(curl -fsS "$URL/readyz") || true
  metrics=$(curl -fsS "$URL/metrics" | grep '^jointspace_execution_provider' || true)
  if [[ "$ready" != *"\"execution_provider\":\"$PROVIDER\""* || "$metrics" != *"provider=\"$PROVIDER\"} 1"* ]]; then
    START_ERROR="the provider is not $PROVIDER: /readyz $ready; /metrics $metrics"
    stop_server
    return 1
  fi
  say "$name: ready in ${READY_S} s ($((SECONDS - t0)) s with the process start), provider $PROVIDER in /readyz and /metrics"
}
# shellcheck source=scripts/lib.sh disable=SC1091
source scripts/lib.sh   # wait_ready

# 3. --device cuda with onnxruntime-gpu's library: there it must serve; here it must refuse, naming why.
if [[ $MODE == dry ]]; then
  set +e
  ORT_DYLIB_PATH=$GPU_ORT timeout 120 "$BIN" serve --addr 127.0.0.1:28599 --bundle "$G/models/flickr8k-vgg16-fne" \
    --device cuda --database-url "sqlite://$W/db/refuse.db" >"$W/logs/refuse-cuda.log" 2>&1
  rc=$?
  set -e
  msg=$(grep -m1 -o 'cannot use the CUDA execution provider.*' "$W/logs/refuse-cuda.log" | cut -c1-500 || true)
  [[ $rc != 0 && -n "$msg" ]] || die "--device cuda on a machine without a GPU: expected a refusal, got exit $rc: $(tail -n 3 "$W/logs/refuse-cuda.log")"
  record cuda-refusal "{\"exit\": $rc, \"message\": $(jstr "$msg")}"
fi

rows_per_photo() { # a bundle's runtime rows per photo: ten crops 10, windowed 2 (the image and its mirror), centre 1
  "$PY" -c 'import json, sys; print({"ten": 10, "windowed": 2}.get(json.load(open(sys.argv[1]))["vision"]["crop_mode"], 1))' \
    "$G/models/$1/bundle.json"
}

# 4. Parity, each bundle on a server with the default batching; every photo alone, as the reference was made.
for b in flickr8k-vgg16-fne flickr8k-effnetl2-fne flickr8k-vgg16-fne-windowed flickr8k-effnetl2-fne-windowed; do
  if (( $(left) < 30 )); then record parity "{\"bundle_dir\": \"$b\", \"skipped\": \"budget\"}"; continue; fi
  if ! start_server "parity-$b" "$b"; then
    record parity "{\"bundle_dir\": \"$b\", \"error\": $(jstr "$START_ERROR")}"
    [[ $b == flickr8k-vgg16-fne ]] && die "the default bundle does not serve on $DEVICE: $START_ERROR"
    continue
  fi
  if r=$("$PY" scripts/gpu_check.py parity --url "$URL" --photos "$PHOTOS" --list "$LIST" --n "$PARITY_N" \
         --ref "$G/ref/$b.json"); then
    record parity "{\"bundle_dir\": \"$b\", \"ready_s\": $READY_S}" "$r"
  else
    record parity "{\"bundle_dir\": \"$b\", \"error\": \"the parity client failed (log above)\"}"
  fi
  stop_server
done

# 5. Ingest photos/s by batch size: in flight about twice the batch in rows (at least 2 requests, so that decoding
#    and the database overlap the runtime), an inference queue that never refuses them, a warm-up first.
ingest_run() {   # bundle, max batch crops, cuDNN's convolution search
  local b=$1 batch=$2 search=$3 rows c name
  rows=$(rows_per_photo "$b")
  local what="\"bundle_dir\": \"$b\", \"max_batch_crops\": $batch, \"conv_search\": \"$search\""
  if (( $(left) < 25 )); then
    record ingest "{$what, \"skipped\": \"budget\"}"; return
  fi
  c=$(( (2 * batch + rows * PER_REQUEST - 1) / (rows * PER_REQUEST) ))
  (( c < 2 )) && c=2
  (( c > MAX_C )) && c=$MAX_C
  name=ingest-$b-$batch-$search
  if ! start_server "$name" "$b" --max-batch-crops "$batch" --inference-queue 8192 --max-queue-wait-ms 0 \
       --cudnn-conv-search "$search"; then
    record ingest "{$what, \"error\": $(jstr "$START_ERROR")}"
    return
  fi
  if r=$("$PY" scripts/gpu_check.py ingest --url "$URL" --photos "$PHOTOS" --list "$LIST" --collection ingest \
         --per-request "$PER_REQUEST" --concurrency "$c" --warmup-s "$WARM_S" --seconds "$TIMED_S"); then
    record ingest "{$what, \"rows_per_photo\": $rows, \"ready_s\": $READY_S}" "$r"
  else
    record ingest "{$what, \"error\": \"the ingest client failed (log above)\"}"
  fi
  stop_server
}
INGEST_BUNDLES=(flickr8k-vgg16-fne flickr8k-vgg16-fne-windowed flickr8k-effnetl2-fne-windowed)
for b in "${INGEST_BUNDLES[@]}"; do
  for batch in 1 16 64 256; do ingest_run "$b" "$batch" heuristic; done
done
# ONNX Runtime's own default, exhaustive, times every algorithm on each new input shape: the batcher's varied
# batch sizes made 64 and 256 crops slower than 16 in the first GPU run. The same machine, side by side.
for b in "${INGEST_BUNDLES[@]}"; do
  for batch in 64 256; do ingest_run "$b" "$batch" exhaustive; done
done

# 6. Sentence search on the default bundle: a collection of SEARCH_N synthetic images (codes through the bundle's
#    projection, as scripts/bench.sh seeds it), searched by the test split's captions at each rate (open loop:
#    latency counted from each request's scheduled start). The server builds its graph from the database.
if (( $(left) > 90 )); then
  t=$SECONDS
  if "$BENCH" seed --database-url "sqlite://$W/db/search.db" --bundle "$G/models/flickr8k-vgg16-fne" \
       --sizes "$SEARCH_N" >"$W/logs/seed.json" 2>"$W/logs/seed.log"; then
    record search-seed "{\"images\": $SEARCH_N, \"seconds\": $((SECONDS - t))}"
    if start_server search flickr8k-vgg16-fne; then   # its database: $W/db/search.db, the one just seeded
      for rate in "${RATES[@]}"; do
        if (( $(left) < SEARCH_S + 15 )); then record search "{\"rate\": $rate, \"skipped\": \"budget\"}"; continue; fi
        if r=$("$BENCH" load --url "$URL/v1/collections/n$SEARCH_N/images/search" --query text \
               --texts "$G/photos/test-captions.txt" --rate "$rate" --seconds "$SEARCH_S" --server-pid "$SERVER_PID" \
               2>>"$W/logs/load.log"); then
          record search "{\"collection\": \"n$SEARCH_N\", \"ready_s\": $READY_S}" "$r"
        else
          record search "{\"rate\": $rate, \"error\": $(jstr "bench load failed: $(tail -n 1 "$W/logs/load.log")")}"
        fi
      done
      stop_server
    else
      record search "{\"error\": $(jstr "$START_ERROR")}"
    fi
  else
    record search-seed "{\"error\": $(jstr "$(tail -n 3 "$W/logs/seed.log")")}"
  fi
else
  record search "{\"skipped\": \"budget\"}"
fi

# 7. With the whole test split staged (GPU_PHOTOS=1000 at prepare time): its R@K through `jointspace eval`.
if (( n_photos >= 1000 )); then
  if (( $(left) > 120 )); then
    mkdir -p "$W/flickr8k"
    ln -sfn "$PHOTOS" "$W/flickr8k/images"
    cp "$LIST" "$W/flickr8k/Flickr_8k.testImages.txt"
    cp "$G/photos/test-captions.txt" "$W/flickr8k/Flickr8k.token.txt"
    if r=$("$BIN" eval --data "$W/flickr8k" --split test --json --device "$DEVICE" --bundle "$G/models/flickr8k-vgg16-fne" \
           --database-url "sqlite://$W/db/eval.db" 2>"$W/logs/eval.log"); then
      record eval "$r"
    else
      record eval "{\"error\": $(jstr "$(tail -n 3 "$W/logs/eval.log")")}"
    fi
  else
    record eval "{\"skipped\": \"budget\"}"
  fi
fi

"$PY" scripts/gpu_check.py report "$RESULTS" --out "$OUTDIR/gpu-check.json"
errors=$(grep -c '"error"' "$RESULTS" || true)
skipped=$(grep -c '"skipped"' "$RESULTS" || true)
say "steps with an error: $errors, skipped for time: $skipped"
(( errors == 0 )) || die "$errors steps failed (results.jsonl)"
say "PASS"
