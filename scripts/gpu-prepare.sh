#!/usr/bin/env bash
# Prepares scripts/gpu-check.sh for a remote GPU machine where nothing can be fetched,
# only the checkout travels (64 MiB a call, the tracked files included) and device time is short
# (docs/benchmarks.md, "GPU"). Everything the check needs that git does not carry becomes one xz archive,
# split into parts under 60 MB, one part per `run` call, in the ignored folder .cache/gpu/ of the checkout that
# travels (the main worktree, also when this runs in another worktree):
#   - onnxruntime-gpu 1.31.1's shared libraries (the cp312 manylinux wheel, fetched by version, sha256 pinned);
#   - the release server and the bench binary (its `seed` and `load`), stripped;
#   - copies of the VGG16 bundle for a GPU in both crop modes (windowed, ten) and of EfficientNet-Lite2
#     windowed, the default bundle's two networks (`jointspace_train gpu-copy`: float32 convolutions, VGG16's
#     int8 dropped, which CUDA has no fast kernels for), each with the training vocabulary's text graph in place of the whole-GloVe one
#     (47 MB less a bundle; the check measures the image path); their float16 forms are made there, in seconds,
#     by the same command (the committed bundles are moved aside for the calls);
#   - the first GPU_PHOTOS photos of the Flickr8k test split, their captions and the split's 5,000 captions;
#   - the CPU reference of the parity check: each bundle's codes and vectors of the first 100 photos, from a
#     local server with the CPU provider (POST /v1/embed/image, one photo at a time).
#
#   scripts/gpu-prepare.sh           # build the payload and its parts (about 20 min on 2 cores; reuses what it can)
#   scripts/gpu-prepare.sh --plan    # only the carry plan, from the sizes measured now
#   scripts/gpu-prepare.sh --aside   # move the committed models/flickr8k-* out of what travels, before the calls
#   scripts/gpu-prepare.sh --restore # and back, after them
#
# Knobs: GPU_STAGE (.cache/gpu of the main worktree), GPU_PHOTOS (1000: the whole test split, for `eval`), GPU_DATA (../shared/data/flickr8k),
# GPU_MODELS (models/ of the main worktree: the vision.onnx that scripts/setup-python.sh rebuilt),
# GPU_PART_MIB (57, i.e. 59.8 MB: with the ~5 MiB of tracked files left a call stays under 64 MiB), GPU_SERVER_BIN and
# GPU_BENCH_BIN (binaries built elsewhere, e.g. the main worktree's target/release: then no cargo here).
# Needs xz, python3 with pip, .venv (scripts/setup-python.sh --train: the windowed copies need the trainer's
# weights) and, without the two binaries given, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
die() { echo "gpu-prepare: $*" >&2; exit 1; }
say() { echo "gpu-prepare: $*"; }

ORT_WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
ORT_WHEEL_SHA256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
ORT_LIBS=(libonnxruntime.so.1.31.1 libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so)
BUNDLES=(flickr8k-vgg16-fne flickr8k-effnetl2-fne)
# The check's bundles: name, source bundle, crop mode.
GPU_BUNDLES=(vgg16-windowed:flickr8k-vgg16-fne:windowed vgg16-ten:flickr8k-vgg16-fne:ten
             effnetl2-windowed:flickr8k-effnetl2-fne:windowed)
REF_PHOTOS=100
LIMIT_MIB=64

# The checkout the runner sends is the main worktree, whichever worktree this runs in.
TRAVEL=$(git worktree list --porcelain 2>/dev/null | awk 'NR == 1 { print $2 }')
[[ -n "$TRAVEL" ]] || TRAVEL=$ROOT
STAGE=${GPU_STAGE:-$TRAVEL/.cache/gpu}
PHOTOS=${GPU_PHOTOS:-1000}
DATA=${GPU_DATA:-$ROOT/../shared/data/flickr8k}
[[ -d "$DATA" ]] || DATA=/work/shared/data/flickr8k
MODELS=${GPU_MODELS:-$TRAVEL/models}
PART_MIB=${GPU_PART_MIB:-57}
ASIDE=$STAGE/aside
BUILD=$STAGE/build      # the payload's tree before it is archived
PY=$ROOT/.venv/bin/python

# Bytes that travel with every call: tracked files present in the travelling checkout, and untracked files
# git does not ignore (what the runner sends besides the carried paths).
travelling_bytes() {
  # Tracked files moved aside (--aside) do not travel: stat skips them.
  (cd "$TRAVEL" && { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | { xargs -0 -r stat -c %s 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }')
}

# plan [projected]: the calls and their sizes; `projected`: as they will be once models/flickr8k-* are aside.
plan() {
  local base parts n i size total=0 call committed
  base=$(travelling_bytes)
  committed=$(cd "$TRAVEL" && git ls-files -z -- 'models/flickr8k-*' | { xargs -0 -r stat -c %s 2>/dev/null || true; } \
    | awk '{ s += $1 } END { print s + 0 }')
  [[ "${1:-}" == projected ]] && base=$((base - committed))
  mapfile -t parts < <(find "$STAGE" -mindepth 1 -maxdepth 1 -type d -name 'call*' -printf '%f\n' | sort -V)
  n=${#parts[@]}
  (( n > 0 )) || die "no parts under $STAGE (run scripts/gpu-prepare.sh first)"
  {
    echo "# GPU check: the carry plan (measured $(date -u +%FT%TZ))"
    echo
    echo "Tracked and untracked-not-ignored files of $TRAVEL: $(( base / 1024 / 1024 )) MiB ($base bytes)."
    if (( committed > 0 )); then
      if [[ "${1:-}" == projected ]]; then
        echo "Counted without models/flickr8k-* ($(( committed / 1024 / 1024 )) MiB): scripts/gpu-prepare.sh --aside before the calls."
      else
        echo "models/flickr8k-* are still in place: run scripts/gpu-prepare.sh --aside before the calls."
      fi
    fi
    echo
    echo "| call | carry | bytes carried | with the checkout | command | timeout_s |"
    echo "|---|---|---|---|---|---|"
    i=0
    for call in "${parts[@]}"; do
      i=$((i + 1))
      size=$(du -sb "$STAGE/$call" | cut -f1)
      total=$((total + size))
      local cmd="bash scripts/gpu-check.sh --receive $i" t=120
      (( i == n )) && { cmd="bash scripts/gpu-check.sh"; t=540; }
      local mark=""
      (( base + size > LIMIT_MIB * 1024 * 1024 )) && mark=" **over 64 MiB**"
      echo "| $i | [\".cache/gpu/$call\"] | $size | $(( (base + size) / 1024 / 1024 )) MiB$mark | \`$cmd\` | $t |"
    done
    echo
    echo "Payload: $total bytes in $n parts. Calls back to back (the machine goes back 30 s after a call)."
  } | tee "$STAGE/plan.md"
  if grep -q 'over 64 MiB' "$STAGE/plan.md"; then
    die "a call would carry more than 64 MiB: move models/flickr8k-* aside (--aside), or remake the parts with a smaller GPU_PART_MIB"
  fi
}

aside() {
  mkdir -p "$ASIDE"
  local d moved=0
  for d in "$TRAVEL"/models/flickr8k-*; do
    [[ -e "$d" ]] || continue
    [[ -e "$ASIDE/$(basename "$d")" ]] && die "$ASIDE/$(basename "$d") exists already: --restore first"
    mv "$d" "$ASIDE/" && moved=$((moved + 1))
  done
  say "moved $moved bundles to $ASIDE (ignored, so they do not travel); put them back with --restore"
}

restore() {
  local d back=0
  for d in "$ASIDE"/flickr8k-*; do
    [[ -e "$d" ]] || continue
    [[ -e "$TRAVEL/models/$(basename "$d")" ]] && die "$TRAVEL/models/$(basename "$d") exists: not overwriting it"
    mv "$d" "$TRAVEL/models/" && back=$((back + 1))
  done
  say "moved $back bundles back to $TRAVEL/models"
}

case "${1:-}" in
  --plan) plan; exit 0 ;;
  --aside) aside; exit 0 ;;
  --restore) restore; exit 0 ;;
  "") ;;
  *) die "unknown argument $1 (none, --plan, --aside or --restore)" ;;
esac

command -v xz >/dev/null || die "xz is needed (apt-get install xz-utils)"
[[ -x "$PY" ]] || die "no .venv here (scripts/setup-python.sh --train)"
[[ -f "$DATA/Flickr_8k.testImages.txt" ]] || die "no Flickr8k at $DATA (GPU_DATA)"
for b in "${BUNDLES[@]}"; do
  [[ -f "$MODELS/$b/vision.onnx" || -f "$ASIDE/$b/vision.onnx" ]] \
    || die "no $MODELS/$b/vision.onnx (scripts/setup-python.sh rebuilds it)"
done
[[ -d "$MODELS/${BUNDLES[0]}" ]] || MODELS=$ASIDE   # already moved aside: read them there
mkdir -p "$STAGE/wheel" "$BUILD"

# 1. onnxruntime-gpu's libraries: the wheel by exact version, checked against the pinned sha256.
if [[ ! -f "$STAGE/wheel/$ORT_WHEEL" ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$STAGE/wheel" onnxruntime-gpu==1.31.1 || die "pip download failed"
fi
echo "$ORT_WHEEL_SHA256  $STAGE/wheel/$ORT_WHEEL" | sha256sum -c --quiet - \
  || die "$ORT_WHEEL: sha256 is not the pinned $ORT_WHEEL_SHA256"
rm -rf "$BUILD/ort" && mkdir -p "$BUILD/ort"
for l in "${ORT_LIBS[@]}"; do
  unzip -q -j -o "$STAGE/wheel/$ORT_WHEEL" "onnxruntime/capi/$l" -d "$BUILD/ort" || die "$l is not in the wheel"
done
say "onnxruntime-gpu libraries: $(du -cb "$BUILD"/ort/* | tail -1 | cut -f1) bytes (the wheel: $(stat -c %s "$STAGE/wheel/$ORT_WHEEL"))"

# 2. The bundles: copies for a GPU (made again only when the source bundle changed), with the training
#    vocabulary's text graph. Files equal across bundles become hard links: the archive holds them once.
rm -rf "$BUILD/models" && mkdir -p "$BUILD/models" "$STAGE/copies"
for spec in "${GPU_BUNDLES[@]}"; do
  IFS=: read -r name src mode <<<"$spec"
  c=$STAGE/copies/$name
  if [[ ! -f "$c/source.sha256" ]] || ! cmp -s <(sha256sum "$MODELS/$src/bundle.json" | cut -d' ' -f1) "$c/source.sha256"; then
    rm -rf "$c"
    (cd "$ROOT" && PYTHONPATH=train nice "$PY" -m jointspace_train gpu-copy "$MODELS/$src" --out "$c" --crop-mode "$mode") \
      || die "gpu-copy $src ($mode) failed"
    (cd "$ROOT" && PYTHONPATH=train "$PY" - "$c" <<'EOF'
import json, sys
from pathlib import Path
from jointspace_train.bundle import contract
d = Path(sys.argv[1])
m = json.loads((d / "bundle.json").read_text())
t = m["text"]
voc = t.pop("vocabulary", None)
if voc:  # the graph the vocabulary was built from, and its tokenizer
    for f in (t["onnx"], t["tokenizer"], voc["map"]):
        (d / f).unlink(missing_ok=True)
    t["onnx"], t["tokenizer"] = voc["from"]["onnx"], voc["from"]["tokenizer"]
m.pop("files")
contract.finish(d, m)
EOF
    ) || die "the training-vocabulary text of $name failed"
    sha256sum "$MODELS/$src/bundle.json" | cut -d' ' -f1 > "$c/source.sha256"
  fi
  mkdir -p "$BUILD/models/$name"
  for f in "$c"/*; do
    [[ $(basename "$f") == source.sha256 ]] && continue
    same=$(find "$BUILD/models" -type f -name "$(basename "$f")" ! -path "*/$name/*" -exec cmp -s {} "$f" \; -print -quit)
    if [[ -n "$same" ]]; then ln -f "$same" "$BUILD/models/$name/"; else cp "$f" "$BUILD/models/$name/"; fi
  done
done

# 3. The photos: the first GPU_PHOTOS of the test split, their captions, and all 5,000 test captions (search).
rm -rf "$BUILD/photos" && mkdir -p "$BUILD/photos/images"
head -n "$PHOTOS" "$DATA/Flickr_8k.testImages.txt" > "$BUILD/photos/list.txt"
(( $(wc -l < "$BUILD/photos/list.txt") == PHOTOS )) || die "the test split has fewer than $PHOTOS photos"
while read -r n; do cp "$DATA/images/$n" "$BUILD/photos/images/"; done < "$BUILD/photos/list.txt"
grep -F -f <(sed 's/$/#/' "$BUILD/photos/list.txt") "$DATA/Flickr8k.token.txt" > "$BUILD/photos/captions.txt"
grep -F -f <(sed 's/$/#/' "$DATA/Flickr_8k.testImages.txt") "$DATA/Flickr8k.token.txt" > "$BUILD/photos/test-captions.txt"
say "photos: $PHOTOS ($(du -sb "$BUILD/photos/images" | cut -f1) bytes), $(wc -l < "$BUILD/photos/test-captions.txt") test captions"

# 4. The CPU reference: each bundle served on the CPU (.venv's onnxruntime) by this checkout's release binary,
#    every photo embedded alone.
# shellcheck source=scripts/lib.sh disable=SC1091
source scripts/lib.sh
ORT_DYLIB_PATH=
ort_dylib
mkdir -p "$BUILD/ref" "$STAGE/logs"
port=28590
SERVER_PID=
stop_server() { [[ -n "$SERVER_PID" ]] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; }
trap stop_server EXIT
for spec in "${GPU_BUNDLES[@]}"; do
  b=${spec%%:*}
  ref=$BUILD/ref/$b.json
  # Made again when the bundle, the photos, onnxruntime or the image path's code (crates/embed) change.
  key=$( (cat "$BUILD/models/$b/bundle.json" "$BUILD/photos/list.txt"; basename "$ORT_DYLIB_PATH"
          git rev-parse HEAD:crates/embed) | sha256sum | cut -d" " -f1)
  if [[ -f "$ref" && "$(cat "$ref.key" 2>/dev/null)" == "$key" ]]; then
    say "CPU reference of $b: kept ($ref)"
    continue
  fi
  db=$(mktemp -d)
  ref_bin=${GPU_SERVER_BIN:-target/release/jointspace}
  [[ -x "$ref_bin" ]] || nice cargo build -q --release --locked --bin jointspace || die "cargo build failed"
  nice "$ref_bin" serve --addr "127.0.0.1:$port" --bundle "$BUILD/models/$b" --device cpu \
    --database-url "sqlite://$db/ref.db" --snapshot-interval 0 >"$STAGE/logs/ref-$b.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "http://127.0.0.1:$port" 300 kill -0 "$SERVER_PID" || { tail -20 "$STAGE/logs/ref-$b.log"; die "the CPU server on $b did not start"; }
  t=$SECONDS
  "$PY" scripts/gpu_check.py embed --url "http://127.0.0.1:$port" --photos "$BUILD/photos/images" \
    --list "$BUILD/photos/list.txt" --n "$REF_PHOTOS" --out "$ref" || die "embedding the photos with $b failed"
  echo "$key" > "$ref.key"
  stop_server
  rm -rf "$db"
  say "CPU reference of $b: $REF_PHOTOS photos in $((SECONDS - t)) s"
done

# 5. The binaries, stripped: GPU_SERVER_BIN and GPU_BENCH_BIN when given (another checkout's build), else this
#    checkout's, built here (`cargo bench --no-run` makes the bench binary and names it).
server=${GPU_SERVER_BIN:-} bench=${GPU_BENCH_BIN:-}
if [[ -z "$server" || -z "$bench" ]]; then
  # This project's machines are shared: let another checkout's cargo finish first (up to GPU_CARGO_WAIT_S).
  waited=0
  while pgrep -x cargo >/dev/null && (( waited < ${GPU_CARGO_WAIT_S:-1800} )); do
    (( waited == 0 )) && say "waiting for another cargo to finish: $(pgrep -a -x cargo | head -n 1 | cut -c1-100)"
    sleep 15; waited=$((waited + 15))
  done
  nice cargo build -q --release --locked --bin jointspace || die "cargo build failed"
  server=${server:-target/release/jointspace}
  [[ -n "$bench" ]] || bench=$(nice bash -c "source scripts/lib.sh && bench_binary")
fi
[[ -x "$server" && -x "$bench" ]] || die "no server ($server) or bench binary ($bench)"
mkdir -p "$BUILD/bin"
strip -o "$BUILD/bin/jointspace" "$server"
strip -o "$BUILD/bin/bench" "$bench"
say "binaries: jointspace $(stat -c %s "$BUILD/bin/jointspace") bytes, bench $(stat -c %s "$BUILD/bin/bench") bytes (stripped)"
# Binaries carried beside an earlier payload (.cache/gpu/bin) would replace these in the check: drop them.
if [[ -d "$STAGE/bin" ]]; then
  rm -rf "$STAGE/bin"
  say "removed the binaries of $STAGE/bin: the payload holds this checkout's build"
fi

# 6. What the payload is: versions, sources, and a sha256 of every file (checked after extraction there).
"$PY" - "$BUILD" "$ORT_WHEEL" "$ORT_WHEEL_SHA256" "$(git rev-parse HEAD)" "$PHOTOS" \
  "$(realpath "$server") $(date -u -r "$server" +%FT%TZ)" "$(realpath "$bench") $(date -u -r "$bench" +%FT%TZ)" \
  <<'EOF' > "$BUILD/meta.json"
import json, sys, datetime
from pathlib import Path
build, wheel, sha, commit, photos, server, bench = sys.argv[1:]
bundles = {}
for d in sorted(Path(build, "models").iterdir()):
    m = json.loads((d / "bundle.json").read_text())
    bundles[d.name] = {"name": m.get("name"), "crop_mode": m["vision"]["crop_mode"]}
print(json.dumps({"made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "git_commit": commit, "onnxruntime_gpu_wheel": wheel, "wheel_sha256": sha,
                  "photos": int(photos), "bundles": bundles, "server_built": server, "bench_built": bench}, indent=1))
EOF
(cd "$BUILD" && find . -type f ! -name MANIFEST.sha256 ! -name '*.key' ! -name source.sha256 -printf '%P\n' \
  | sort | xargs -d '\n' sha256sum) > "$STAGE/MANIFEST.tmp"
mv "$STAGE/MANIFEST.tmp" "$BUILD/MANIFEST.sha256"

# 7. The archive: xz, which a GPU machine has (and if not, Python's lzma module reads it), in two pieces: the
#    onnxruntime libraries, compressed once per wheel, and the rest, each vision graph next to its windowed copy
#    (the 64 MiB window of xz -9 finds the weights they share) and hard links stored once. Split into equal
#    parts of at most GPU_PART_MIB MiB, one folder per call.
XZ=(xz -q -T2 -9)
mkdir -p "$STAGE/cache"
ort_xz=$STAGE/cache/ort-$ORT_WHEEL_SHA256.tar.xz
if [[ ! -f "$ort_xz" ]]; then
  say "compressing onnxruntime's libraries (xz -9, several minutes)"
  tar -C "$BUILD" -cf - --transform 's,^,gpu/,' ort | nice "${XZ[@]}" -c > "$ort_xz.tmp" && mv "$ort_xz.tmp" "$ort_xz"
fi
rm -rf "$STAGE/pack" && mkdir -p "$STAGE/pack"
# The rest is compressed again only when a file in it changed (meta.json's date aside).
rest_xz=$STAGE/cache/rest-$(grep -v ' meta.json$' "$BUILD/MANIFEST.sha256" | sha256sum | cut -d' ' -f1).tar.xz
if [[ -f "$rest_xz" ]]; then
  say "the rest: unchanged since $rest_xz"
else
  say "compressing the rest (xz -9, a few minutes)"
  rm -f "$STAGE"/cache/rest-*.tar.xz
  (cd "$BUILD" && {
    printf '%s\n' MANIFEST.sha256 meta.json
    for spec in "${GPU_BUNDLES[@]}"; do printf '%s\n' "models/${spec%%:*}/vision.onnx"; done
    find bin photos ref models -type f ! -name vision.onnx ! -name '*.key' ! -name source.sha256 | sort
  }) | tar -C "$BUILD" --no-recursion -T - -cf - --transform 's,^,gpu/,' | nice "${XZ[@]}" -c > "$rest_xz.tmp"
  mv "$rest_xz.tmp" "$rest_xz"
fi
cp "$rest_xz" "$STAGE/pack/gpu-rest.tar.xz"
cp "$ort_xz" "$STAGE/pack/gpu-ort.tar.xz"
tar -C "$STAGE/pack" -cf "$STAGE/payload.tar" gpu-ort.tar.xz gpu-rest.tar.xz
rm -rf "$STAGE/pack"
total=$(stat -c %s "$STAGE/payload.tar")
limit=$((PART_MIB * 1024 * 1024))
n=$(( (total + limit - 1) / limit ))
per=$(( (total + n - 1) / n ))
rm -rf "$STAGE"/call*
(cd "$STAGE" && split -a 2 -d -b "$per" payload.tar payload.part-)
sha=$(sha256sum "$STAGE/payload.tar" | cut -d' ' -f1)
i=0
for p in "$STAGE"/payload.part-*; do
  i=$((i + 1))
  mkdir -p "$STAGE/call$i"
  mv "$p" "$STAGE/call$i/"
done
# Every call's folder names every part and the whole's sha256, so the check can say which part is missing.
(cd "$STAGE" && sha256sum call*/payload.part-* > parts.sha256)
for d in "$STAGE"/call*; do
  cp "$STAGE/parts.sha256" "$d/parts.sha256"
  echo "$sha  payload.tar" > "$d/payload.sha256"
done
rm -f "$STAGE/payload.tar"
say "payload: $total bytes, sha256 $sha, $n parts of at most $per bytes under $STAGE/call1..call$n"
plan projected
