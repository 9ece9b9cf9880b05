#!/usr/bin/env bash
# Fuzzes image decoding and tokenisation (fuzz/, cargo-fuzz on nightly) for a bounded time each and fails on
# any crash. Seeds: the test fixtures (images) and Flickr8k-like sentences.
#
#   scripts/fuzz.sh                 # FUZZ_SECONDS=300 per target
#   FUZZ_SECONDS=60 scripts/fuzz.sh decode
# Needs a nightly toolchain (`rustup toolchain install nightly`) and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-300}
targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(decode tokenize)
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# The tokenisation target reads the VGG16 bundle's tokenizer.json (committed); decode needs nothing else.
mkdir -p fuzz/corpus/decode fuzz/corpus/tokenize
cp -n tests/fixtures/images/* tests/fixtures/jpeg/* fuzz/corpus/decode/ 2>/dev/null || true
i=0
for s in "a dog running on the beach" "Two men ." "A child in a pink dress is climbing up a set of stairs ." \
         "ünïcödé 🐕 sentences – with dashes" "   " "don't stop!!! 123"; do
  printf '%s' "$s" > "fuzz/corpus/tokenize/seed$i"; i=$((i + 1))
done
mkdir -p fuzz/logs
for t in "${targets[@]}"; do
  echo "== fuzz $t for ${SECONDS_EACH}s"
  # -rss_limit_mb: a decode that allocates past the limits is a bug, not a slow input.
  rc=0
  # -O: optimised without debug assertions, as the server is built.
  cargo +nightly fuzz run -O --fuzz-dir fuzz "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 >"fuzz/logs/$t.log" 2>&1 || rc=$?
  grep -E '^(#[0-9]+ +(INITED|DONE)|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|Done)' \
    "fuzz/logs/$t.log" || true
  if [[ $rc -ne 0 ]]; then
    tail -40 "fuzz/logs/$t.log"; echo "fuzz $t: CRASH (exit $rc; inputs in fuzz/artifacts/$t/)"; exit 1
  fi
done
echo "fuzz: no crash"
