#!/usr/bin/env bash
# Soak test: the release server under a mixed load of ingest and search for SOAK_SECONDS (default 600),
# sampling its RSS every 10 s. Fails on any error (5xx, 4xx other than 429, connection failure) or when memory
# keeps growing: the RSS at the end may exceed the RSS after warm-up by at most SOAK_RSS_GROWTH_MB (64).
# The ingest side cycles collections (create, add Flickr8k photos with captions, search them, delete), so the
# data held stays bounded and a growing RSS means a leak; the search side queries a fixed base collection.
#
#   scripts/soak.sh                                   # default bundle, 10 minutes
#   SOAK_SECONDS=120 JOINTSPACE_BUNDLE=models/fixture-tiny scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECONDS=${SOAK_SECONDS:-600}
export SOAK_DATA=${SOAK_DATA:-../shared/data/flickr8k}
bundle=${JOINTSPACE_BUNDLE:-models/flickr8k-vgg16-fne}
scripts/setup-python.sh
source scripts/server.sh
start_server "$bundle" --snapshot-interval 60
status=0
python3 scripts/soak.py "$base" "$pid" || status=$?
check_server || status=1
exit $status
