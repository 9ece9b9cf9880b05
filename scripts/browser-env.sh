# Sourced by the scripts that drive a browser (browser-test.sh, page-screenshot.sh): checks for Debian's chromium
# and chromedriver and makes the virtualenv with Selenium and pytest (.cache/browser-venv), setting `venv`.
# (Selenium 4.52.0 needs certifi>=2026.10.23, which the package index did not serve when this was pinned.)
SELENIUM_VERSION=4.51.0
PYTEST_VERSION=9.2.0
export CHROMIUM=${CHROMIUM:-/usr/bin/chromium} CHROMEDRIVER=${CHROMEDRIVER:-/usr/bin/chromedriver}
for prog in "$CHROMIUM" "$CHROMEDRIVER"; do
  [[ -x $prog ]] || { echo "$0: $prog is missing (apt-get install chromium chromium-driver)" >&2; exit 1; }
done
venv=.cache/browser-venv
if ! "$venv/bin/python" -c "import selenium, pytest, sys; sys.exit(selenium.__version__ != '$SELENIUM_VERSION' or pytest.__version__ != '$PYTEST_VERSION')" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "selenium==$SELENIUM_VERSION" "pytest==$PYTEST_VERSION"
fi
