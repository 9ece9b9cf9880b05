# Sourced by the scripts that run the server (serve.sh, server.sh, test.sh, bench.sh, memory.sh,
# page-screenshot.sh, container-smoke.sh, compose-smoke.sh, browser-test.sh): what each needs, written once.

# The Flickr8k folder (images/, Flickr8k.token.txt, the splits): JOINTSPACE_FLICKR8K, else ../shared/data/flickr8k
# beside the checkout. The one place a script names a path outside the repository; the test command runs without
# it (flickr8k_present says whether it is there, and the smoke tests fall back to the repository's fixtures).
flickr8k_dir() { echo "${JOINTSPACE_FLICKR8K:-../shared/data/flickr8k}"; }
flickr8k_present() { [[ -f "$(flickr8k_dir)/Flickr8k.token.txt" && -d "$(flickr8k_dir)/images" ]]; }

# smoke_photo N: sets `photo` (a path), `photo_name` and `caps` (its captions, an array) for the smoke tests: the
# image of Flickr8k's Nth caption line with its five captions where the data set is there, else one of the
# repository's fixture photos (tests/fixtures/images) with its captions in tests/fixtures/captions.tsv (a line each: file, tab, caption).
smoke_photo() {
  local n=$1 data
  if flickr8k_present; then
    data=$(flickr8k_dir)
    photo_name=$(sed -n "${n}p" "$data/Flickr8k.token.txt" | cut -d'#' -f1)
    photo="$data/images/$photo_name"
    mapfile -t caps < <(grep "^$photo_name#" "$data/Flickr8k.token.txt" | cut -f2)
  else
    local fixtures=tests/fixtures files
    mapfile -t files < <(cut -f1 "$fixtures/captions.tsv" | awk '!seen[$0]++')
    photo_name=${files[$(( (n - 1) % ${#files[@]} ))]}
    photo="$fixtures/images/$photo_name"
    mapfile -t caps < <(awk -F'\t' -v f="$photo_name" '$1 == f { print $2 }' "$fixtures/captions.tsv")
  fi
  [[ -f "$photo" && ${#caps[@]} -gt 0 ]] || { echo "smoke_photo: no photo with captions for line $n" >&2; return 1; }
}

# The default bundle: the server's own `--bundle` default (src/config.rs; tests/it/cli.rs checks that they agree).
DEFAULT_BUNDLE=models/flickr8k-vgg16-effnetl2-fne
# Whether scripts/setup-python.sh has built the default bundle's generated files: every file its bundle.json names
# is there (its vision graphs, whole-vocabulary text graph and labels are made from their packages, not committed).
default_bundle_built() {
  python3 -c 'import json, os, sys; d = sys.argv[1]; m = json.load(open(f"{d}/bundle.json"))
sys.exit(any(not os.path.isfile(f"{d}/{f}") for f in m["files"]))' "$DEFAULT_BUNDLE"
}

# ORT_DYLIB_PATH, exported: the caller's, or onnxruntime's shared library from the .venv that
# scripts/setup-python.sh made (the server loads it at start: ort's load-dynamic).
ort_dylib() {
  if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
    ORT_DYLIB_PATH=$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1)
  fi
  [[ -f "$ORT_DYLIB_PATH" ]] || {
    echo "no onnxruntime library (run scripts/setup-python.sh, or set ORT_DYLIB_PATH)" >&2
    return 1
  }
  export ORT_DYLIB_PATH
}

# elapsed T0 T1: the seconds between two `date +%s.%N` readings, as a JSON number (bc would write .72 for 0.72).
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }

# wait_ready URL SECONDS [CHECK...]: polls URL/readyz until it answers 200; fails (returns 1, saying why) after
# SECONDS, or as soon as the command CHECK (e.g. `kill -0 $pid`: is the server still running?) fails.
wait_ready() {
  local url=$1 limit=$2 start=$SECONDS
  shift 2
  until curl -fsS "$url/readyz" >/dev/null 2>&1; do
    if (( $# )) && ! "$@" 2>/dev/null; then
      echo "the server stopped before $url/readyz answered" >&2
      return 1
    fi
    if (( SECONDS - start >= limit )); then
      echo "$url/readyz not ready after $limit s" >&2
      return 1
    fi
    sleep 0.05
  done
}

# Builds the bench binary (benches/bench.rs) and prints its path.
bench_binary() {
  cargo bench -q --locked --bench bench --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "bench":
        print(m["executable"])'
}
