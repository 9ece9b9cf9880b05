# Sourced by scripts/openvocab.sh and scripts/demo.sh: Debian's tuxpaint-stamps-default (pictures of named
# things, each with a one-line description), fetched by exact version and checked by its sha256, then prepared
# as a gallery:
#   fetch_stamps    sets STAMPS_GALLERY (.cache/openvocab/gallery: images/<id>.png and manifest.jsonl)
# The pictures are GPL-2 (the package's /usr/share/doc/tuxpaint-stamps-default/copyright, kept beside them as
# COPYRIGHT): they stay under .cache/, which git ignores, and are never committed.
# Needs apt-get download or curl (deb.debian.org), dpkg-deb or ar+tar, and a python with Pillow ($PY, else
# .venv/bin/python, else python3).

STAMPS_VERSION=2022.06.04-1   # Debian bookworm's
STAMPS_SHA256=6db6c1bfc870a47f1499d6203b083522eacb57c5f9c87d468f2e92eb6d9d5f34
STAMPS_POOL=https://deb.debian.org/debian/pool/main/t/tuxpaint-stamps
STAMPS_CACHE=.cache/openvocab
STAMPS_DEB=$STAMPS_CACHE/tuxpaint-stamps-default_${STAMPS_VERSION}_all.deb
STAMPS_GALLERY=$STAMPS_CACHE/gallery

fetch_stamps() {
  local py=${PY:-}
  [[ -n "$py" ]] || { py=$PWD/.venv/bin/python; [[ -x "$py" ]] || py=python3; }
  mkdir -p "$STAMPS_CACHE"
  # The package, by exact version: apt where there is one, else the Debian pool; either way its sha256.
  if [[ ! -f "$STAMPS_DEB" ]]; then
    (cd "$STAMPS_CACHE" && apt-get download "tuxpaint-stamps-default=$STAMPS_VERSION" 2>/dev/null) \
      || curl -fsSL -o "$STAMPS_DEB" "$STAMPS_POOL/tuxpaint-stamps-default_${STAMPS_VERSION}_all.deb"
  fi
  echo "$STAMPS_SHA256  $STAMPS_DEB" | sha256sum -c --quiet || return 1
  # The gallery: the package extracted, every PNG stamp with a description flattened onto white, the manifest.
  if [[ ! -f "$STAMPS_GALLERY/manifest.jsonl" || "$STAMPS_GALLERY/manifest.jsonl" -ot "$STAMPS_DEB" ]]; then
    rm -rf "$STAMPS_CACHE/pkg" "$STAMPS_GALLERY"
    mkdir -p "$STAMPS_CACHE/pkg"
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$STAMPS_DEB" "$STAMPS_CACHE/pkg"
    else
      (cd "$STAMPS_CACHE/pkg" && ar p "../$(basename "$STAMPS_DEB")" data.tar.xz | tar -xJ)
    fi
    mkdir -p "$STAMPS_CACHE/results"
    (cd train && "$py" -m jointspace_train.evaluation.openvocab prepare \
      --stamps "$PWD/../$STAMPS_CACHE/pkg/usr/share/tuxpaint/stamps" --out "$PWD/../$STAMPS_GALLERY") >"$STAMPS_CACHE/results/prepare.json"
    cp "$STAMPS_CACHE/pkg/usr/share/doc/tuxpaint-stamps-default/copyright" "$STAMPS_GALLERY/COPYRIGHT"
  fi
}
