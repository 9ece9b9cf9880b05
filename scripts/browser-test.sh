#!/usr/bin/env bash
# The search page (web/, served at /) in a real browser: Debian's chromium and chromedriver, driven by Selenium
# (PyPI) from tests/browser/test_page.py, against the release server on the fixture bundle with a scratch
# SQLite database, an admin key and a 1 MiB request limit. Screenshots go to target/browser/.
#
#   scripts/browser-test.sh
# Needs chromium and chromium-driver (Debian; .ci/run installs them). Its own virtualenv
# (.cache/browser-venv) keeps the tools out of the trainer's requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/browser-env.sh

# Three real photos to upload: Flickr8k's first test photos when the data set is beside the checkout (as in
# CI), else the repository's fixture images.
source scripts/lib.sh
flickr=$(flickr8k_dir)
if flickr8k_present && [[ -f $flickr/Flickr_8k.testImages.txt ]]; then
  BROWSER_PHOTOS=$(head -n 3 "$flickr/Flickr_8k.testImages.txt" | sed "s|^|$(cd "$flickr" && pwd)/images/|")
else
  BROWSER_PHOTOS=$(ls "$PWD"/tests/fixtures/images/fixture_{4,5,7}.png)
fi
export BROWSER_PHOTOS

source scripts/server.sh
key=browser-test-admin-key-$RANDOM$RANDOM
# A 1 MiB body limit, so that the page's message for a too-large upload can be checked with a small file.
export JOINTSPACE_MAX_REQUEST_BYTES=1048576
JOINTSPACE_ADMIN_KEY=$key start_server models/fixture-tiny --snapshot-interval 0
export JOINTSPACE_URL=$base JOINTSPACE_KEY=$key BROWSER_SHOTS=${BROWSER_SHOTS:-target/browser}
echo "== the search page in chromium ($("$CHROMIUM" --version 2>/dev/null)) against $base"
status=0
"$venv/bin/python" -m pytest -q --tb=short -p no:cacheprovider tests/browser || status=$?
check_server || status=1
[[ $status == 0 ]] && echo "screenshots: $BROWSER_SHOTS/"
exit "$status"
