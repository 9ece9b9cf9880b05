#!/usr/bin/env bash
# The GPU check, in one call on a remote GPU machine that only the checkout travels to (docs/benchmarks.md,
# "GPU"): joins the parts scripts/gpu-prepare.sh staged in .cache/gpu/, checks them, and measures the CUDA
# provider:
#   - the device, its driver, the CUDA / cuDNN libraries found in python3's site-packages, ONNX Runtime, and
#     whether a container runtime is there (for the CUDA image);
#   - float16 copies of the staged float32 bundles, made there (`jointspace_train gpu-copy --half`);
#   - each vision graph alone (`bench graph`): crops/s at fixed shapes by precision (float32, TF32, float16),
#     layout (NHWC) and calls in flight;
#   - ingest photos/s through `jointspace serve --device cuda` (every server's /readyz and /metrics naming the
#     provider), clients in several processes posting batches of photos, with the GPU's busy share: the server
#     as it ran before (one session, unpadded shapes, no TF32) and as it runs now, per bundle and precision;
#   - `jointspace eval` of the Flickr8k test split on the device, per bundle;
#   - parity: the codes and vectors of 100 test photos against the CPU reference (float16 against float32);
#   - the stage profile of the image path (`bench ingest --device cuda`): where a photo's time goes;
#   - sentence search p50/p99 at 200 and 1,000 req/s (open loop) on a seeded collection;
#   - `jointspace ingest --device cuda` of the staged photos (the batch command).
# Results in $OUT (the runner brings that folder back; here target/gpu-check): gpu-check.log,
# results.jsonl (one JSON object a step), gpu-check.json (those and the tables as markdown), server-logs.tar.gz.
#
#   bash scripts/gpu-check.sh              # there, in the last call (the parts carried by the calls before)
#   bash scripts/gpu-check.sh --receive K  # there, in call K < last: checks part K arrived whole
#   scripts/gpu-check.sh --dry-run         # here: the same steps on the CPU (.venv's onnxruntime, --device cpu),
#                                          # with smaller counts and shorter runs
# Knobs: GPU_BUDGET_S (420 there: the steps left when it runs out are skipped and say so), GPU_STAGE, GPU_WORK.
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
  BUDGET=${GPU_BUDGET_S:-420} PY=python3 DEVICE=cuda PROVIDER=cuda
  PARITY_N=100 WARM_S=2 TIMED_S=5 PER_REQUEST=32 MIN_C=8 MAX_C=64 CLI_N=0 GRAPH_S=1.5 ROWS_BIG=256 ROWS_ALL=16,64,256
  MAX_BATCH=256 PROFILE_N=512 PROFILE_C=32 EVAL_ARGS=(--batch 32 --concurrency 8)
  SEARCH_N=${GPU_SEARCH_N:-10000} RATES=(200 1000) SEARCH_S=10
else
  BUDGET=${GPU_BUDGET_S:-1500} PY=$ROOT/.venv/bin/python DEVICE=cpu PROVIDER=cpu
  PARITY_N=4 WARM_S=1 TIMED_S=3 PER_REQUEST=1 MIN_C=2 MAX_C=2 CLI_N=4 GRAPH_S=0.5 ROWS_BIG=2 ROWS_ALL=1,2
  MAX_BATCH=4 PROFILE_N=4 PROFILE_C=2 EVAL_ARGS=(--limit 8)
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
# Binaries built after the payload (carried alone in .cache/gpu/bin, one call of their own) replace the staged ones.
for x in jointspace bench; do
  if [[ -x $STAGE/bin/$x ]]; then
    cp "$STAGE/bin/$x" "$G/bin/$x"
    say "$x binary from $STAGE/bin: sha256 $(sha256sum "$G/bin/$x" | cut -d' ' -f1)"
  fi
done
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
# The CUDA image needs a container runtime there; where there is none, the same binary and libraries run outside it.
runtimes=$(for r in docker podman nerdctl ctr; do command -v "$r" >/dev/null && echo -n "$r "; done; true)
record environment "{\"mode\": \"$MODE\", \"device\": $(jstr "$smi"), \"cpus\": $(nproc), \"kernel\": $(jstr "$(uname -r)"),
  \"container_runtimes\": $(jstr "${runtimes:-none}"),
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
  ORT_DYLIB_PATH=$GPU_ORT timeout 120 "$BIN" serve --addr 127.0.0.1:28599 --bundle "$G/models/vgg16-windowed" \
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

# 4. The float16 forms of the staged float32 copies (`jointspace_train gpu-copy --half`, from their own graphs).
HALF=()
for b in vgg16-windowed vgg16-ten effnetl2-windowed; do
  t=$SECONDS
  if (cd "$ROOT" && PYTHONPATH=train "$PY" -m jointspace_train gpu-copy "$G/models/$b" --out "$G/models/$b-half" --half \
        >"$W/logs/half-$b.log" 2>&1); then
    HALF+=("$b-half")
    record half "{\"bundle_dir\": \"$b-half\", \"seconds\": $((SECONDS - t))}"
  else
    record half "{\"bundle_dir\": \"$b-half\", \"error\": $(jstr "$(tail -n 3 "$W/logs/half-$b.log")")}"
  fi
done

# The float16 copies where they were made, else the float32 ones, for the runs below that take one of each.
best_vgg=vgg16-windowed best_ten=vgg16-ten best_eff=effnetl2-windowed
[[ " ${HALF[*]} " == *" vgg16-windowed-half "* ]] && best_vgg=vgg16-windowed-half
[[ " ${HALF[*]} " == *" vgg16-ten-half "* ]] && best_ten=vgg16-ten-half
[[ " ${HALF[*]} " == *" effnetl2-windowed-half "* ]] && best_eff=effnetl2-windowed-half

# 5. Each graph alone (`bench graph`: synthetic crops, fixed shapes, copies to and from the device included):
#    crops/s by precision (float32 as ONNX Runtime runs it by default, in TF32, float16), layout and calls in
#    flight. What the whole path below reaches is read against these.
graph_run() {   # bundle, rows, sessions, tf32, nhwc[, cuDNN search]
  local search=${6:-heuristic}
  local what="\"bundle_dir\": \"$1\", \"sessions\": $3, \"tf32\": \"$4\", \"nhwc\": \"$5\", \"conv_search\": \"$search\""
  if (( $(left) < 40 )); then record graph "{$what, \"skipped\": \"budget\"}"; return; fi
  if r=$(timeout 120 "$BENCH" graph --bundle "$G/models/$1" --device "$DEVICE" --rows "$2" --sessions "$3" \
         --tf32 "$4" --nhwc "$5" --conv-search "$search" --seconds "$GRAPH_S" 2>>"$W/logs/graph.log"); then
    record graph "{$what}" "$r"
  else
    record graph "{$what, \"error\": $(jstr "$(tail -n 2 "$W/logs/graph.log")")}"
  fi
}
has_half() { [[ " ${HALF[*]} " == *" $1-half "* ]]; }
# Measured on an H200 (docs/benchmarks.md): exhaustive search and NHWC within 5%, so one of each stays as a check.
graph_run vgg16-windowed "$ROWS_BIG" 1 off off
graph_run vgg16-windowed "$ROWS_BIG" 1 on off
graph_run vgg16-windowed "$ROWS_BIG" 2 on off
if has_half vgg16-windowed; then
  graph_run vgg16-windowed-half "$ROWS_ALL" 1 on off
  graph_run vgg16-windowed-half "$ROWS_BIG" 2 on off
  graph_run vgg16-windowed-half "$ROWS_BIG" 1 on on
fi
has_half vgg16-ten && graph_run vgg16-ten-half "$ROWS_BIG" 1 on off exhaustive
graph_run effnetl2-windowed "$ROWS_ALL" 1 on off
has_half effnetl2-windowed && graph_run effnetl2-windowed-half "$ROWS_ALL" 1 on off

# 6. The stage profile of each bundle's image path (`bench ingest`: the whole path as the server runs it, with
#    concurrent requests, then each stage alone on one thread but the runtime's: where a photo's time goes).
profile_run() {   # bundle, sessions, pad
  local what="\"bundle_dir\": \"$1\", \"vision_sessions\": $2, \"pad_batches\": \"$3\""
  if (( $(left) < 60 )); then record profile "{$what, \"skipped\": \"budget\"}"; return; fi
  if r=$(timeout 150 "$BENCH" ingest --bundle "$G/models/$1" --images "$PHOTOS" --n "$PROFILE_N" --device "$DEVICE" \
         --vision-sessions "$2" --pad-batches "$3" --max-batch-crops "$MAX_BATCH" --batch 8 --concurrency "$PROFILE_C" \
         --threads "$(nproc)" --release-memory false 2>>"$W/logs/profile.log"); then
    record profile "{$what}" "$r"
  else
    record profile "{$what, \"error\": $(jstr "$(tail -n 2 "$W/logs/profile.log")")}"
  fi
}
profile_run "$best_vgg" 2 on
profile_run "$best_ten" 2 on
profile_run "$best_eff" 2 on

# 7. Ingest photos/s through `serve`: clients in several processes post pre-encoded JSON batches of photos, about
#    four batches' rows in flight, after a warm-up; the GPU's busy share sampled by nvidia-smi meanwhile.
#    First the server as it ran before (one session, unpadded shapes, float32 without TF32), then as it runs
#    now (two sessions, padded shapes, TF32), then the float16 copies.
ingest_run() {   # bundle, max batch crops, sessions, pad, tf32[, full calls' rows in flight (4)[, warm shapes (off)]]
  local b=$1 batch=$2 rows c name calls=${6:-4} warm=${7:-off}
  rows=$(rows_per_photo "$b")
  local what="\"bundle_dir\": \"$b\", \"max_batch_crops\": $batch, \"vision_sessions\": $3, \"pad_batches\": \"$4\", \"tf32\": \"$5\", \"calls_in_flight\": $calls, \"warm_shapes\": \"$warm\""
  if (( $(left) < 25 )); then
    record ingest "{$what, \"skipped\": \"budget\"}"; return
  fi
  c=$(( (calls * batch + rows * PER_REQUEST - 1) / (rows * PER_REQUEST) ))
  (( c < MIN_C )) && c=$MIN_C
  (( c > MAX_C )) && c=$MAX_C
  # Here a ten-crop photo takes seconds on two cores: time it long enough for requests to finish.
  local timed=$TIMED_S
  [[ $MODE == dry ]] && (( rows >= 10 )) && timed=$((4 * TIMED_S))
  name=ingest-$b-$batch-$3-$4-$5-$calls-$warm
  if ! start_server "$name" "$b" --max-batch-crops "$batch" --inference-queue 16384 --max-queue-wait-ms 0 \
       --vision-sessions "$3" --pad-batches "$4" --cuda-tf32 "$5" --warm-batch-shapes "$warm"; then
    record ingest "{$what, \"error\": $(jstr "$START_ERROR")}"
    return
  fi
  if r=$("$PY" scripts/gpu_check.py ingest --url "$URL" --photos "$PHOTOS" --list "$LIST" --collection ingest \
         --per-request "$PER_REQUEST" --concurrency "$c" --warmup-s "$WARM_S" --seconds "$timed"); then
    record ingest "{$what, \"rows_per_photo\": $rows, \"ready_s\": $READY_S}" "$r"
  else
    record ingest "{$what, \"error\": \"the ingest client failed (log above)\"}"
  fi
  stop_server
}
# The server as it runs now (the server as it ran before comes last, below).
ingest_run vgg16-windowed "$MAX_BATCH" 2 on on
ingest_run "$best_vgg" "$MAX_BATCH" 2 on on
# Twice the requests in flight: the server answered 718 ms a request at p50 with the GPU 40% busy.
ingest_run "$best_vgg" "$MAX_BATCH" 2 on on 8
ingest_run "$best_ten" "$MAX_BATCH" 2 on on
# EfficientNet-Lite2 plans each new shape for seconds a session: one session, unpadded, requests of 64 rows; then
# the defaults with every padded shape planned before serving (its "ready" seconds are that planning), and
# without.
ingest_run "$best_eff" 64 1 off on
ingest_run "$best_eff" 64 2 on on 4 on
ingest_run "$best_eff" 64 2 on on

# 8. Sentence search: a collection of SEARCH_N synthetic images (codes through the bundle's projection, as
#     scripts/bench.sh seeds it), searched by the test split's captions at each rate (open loop: latency counted
#     from each request's scheduled start). The server builds its graph from the database.
if (( $(left) > 40 )); then
  t=$SECONDS
  if "$BENCH" seed --database-url "sqlite://$W/db/search.db" --bundle "$G/models/$best_vgg" \
       --sizes "$SEARCH_N" >"$W/logs/seed.json" 2>"$W/logs/seed.log"; then
    record search-seed "{\"images\": $SEARCH_N, \"seconds\": $((SECONDS - t))}"
    if start_server search "$best_vgg"; then   # its database: $W/db/search.db, the one just seeded
      for rate in "${RATES[@]}"; do
        if (( $(left) < SEARCH_S + 10 )); then record search "{\"rate\": $rate, \"skipped\": \"budget\"}"; continue; fi
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

# 9. The test split's R@K through `jointspace eval` on the device (1,000 photos staged), each bundle against
#     its float32 copy's figure on the CPU (docs/benchmarks.md, "GPU").
if (( n_photos >= 1000 )); then
  mkdir -p "$W/flickr8k"
  ln -sfn "$PHOTOS" "$W/flickr8k/images"
  cp "$LIST" "$W/flickr8k/Flickr_8k.testImages.txt"
  cp "$G/photos/test-captions.txt" "$W/flickr8k/Flickr8k.token.txt"
  for b in "$best_vgg" vgg16-windowed "$best_eff" "$best_ten"; do
    if (( $(left) < 45 )); then record eval "{\"bundle_dir\": \"$b\", \"skipped\": \"budget\"}"; continue; fi
    if r=$("$BIN" eval --data "$W/flickr8k" --split test --json --device "$DEVICE" --bundle "$G/models/$b" "${EVAL_ARGS[@]}" \
           --database-url "sqlite://$W/db/eval-$b.db" 2>"$W/logs/eval-$b.log"); then
      record eval "{\"bundle_dir\": \"$b\"}" "$r"
    else
      record eval "{\"bundle_dir\": \"$b\", \"error\": $(jstr "$(tail -n 3 "$W/logs/eval-$b.log")")}"
    fi
  done
fi

# 10. Parity, each bundle on a server with the default batching; every photo alone, as the reference was made
#    (float16 against its float32 copy's CPU codes).
for b in "${HALF[@]}" vgg16-windowed vgg16-ten effnetl2-windowed; do
  [[ $b != *-half ]] && (( $(left) < 90 )) && { record parity "{\"bundle_dir\": \"$b\", \"skipped\": \"budget\"}"; continue; }
  ref=$G/ref/${b%-half}.json
  if (( $(left) < 30 )); then record parity "{\"bundle_dir\": \"$b\", \"skipped\": \"budget\"}"; continue; fi
  if ! start_server "parity-$b" "$b"; then
    record parity "{\"bundle_dir\": \"$b\", \"error\": $(jstr "$START_ERROR")}"
    continue
  fi
  other=()
  [[ $b == *-half ]] && other=(--other-graph)
  if r=$("$PY" scripts/gpu_check.py parity --url "$URL" --photos "$PHOTOS" --list "$LIST" --n "$PARITY_N" \
         --ref "$ref" "${other[@]}"); then
    record parity "{\"bundle_dir\": \"$b\", \"ready_s\": $READY_S}" "$r"
  else
    record parity "{\"bundle_dir\": \"$b\", \"error\": \"the parity client failed (log above)\"}"
  fi
  stop_server
done

# The server as it ran before: one session, unpadded shapes, float32 without TF32 (the graphs' float16
# copies did not exist).
ingest_run vgg16-windowed "$MAX_BATCH" 1 off off
ingest_run effnetl2-windowed 64 1 off off

# 11. The batch command: `jointspace ingest --device cuda` of the staged photos (a folder) into SQLite.
if (( $(left) > 60 )); then
  cli_list=$LIST
  if (( CLI_N > 0 )); then   # here: a few photos, that the step runs, not how fast
    head -n "$CLI_N" "$LIST" > "$W/cli-list.txt" && cli_list=$W/cli-list.txt n_photos=$CLI_N
  fi
  t0=$(date +%s.%N)
  if "$BIN" ingest --images "$PHOTOS" --list "$cli_list" --collection cli --bundle "$G/models/$best_vgg" --device "$DEVICE" \
       --batch 32 --concurrency 8 --database-url "sqlite://$W/db/cli.db" >"$W/logs/cli-ingest.log" 2>&1; then
    s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    record cli-ingest "{\"bundle_dir\": \"$best_vgg\", \"photos\": $n_photos, \"seconds\": $s,
      \"photos_per_s\": $(awk -v n="$n_photos" -v s="$s" 'BEGIN { printf "%.1f", n / s }')}"
  else
    record cli-ingest "{\"bundle_dir\": \"$best_vgg\", \"error\": $(jstr "$(tail -n 3 "$W/logs/cli-ingest.log")")}"
  fi
else
  record cli-ingest "{\"skipped\": \"budget\"}"
fi

"$PY" scripts/gpu_check.py report "$RESULTS" --out "$OUTDIR/gpu-check.json"
errors=$(grep -c '"error"' "$RESULTS" || true)
skipped=$(grep -c '"skipped"' "$RESULTS" || true)
say "steps with an error: $errors, skipped for time: $skipped"
(( errors == 0 )) || die "$errors steps failed (results.jsonl)"
say "PASS"
