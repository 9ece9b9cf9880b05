#!/usr/bin/env bash
# Podman, ready to build and run the Dockerfile, on a machine that may have no container registry in reach
# (what scripts/test.sh needs for its container stage).
#
#   scripts/container-setup.sh && source "${CONTAINER_SANDBOX:-/tmp/container-sandbox}/env.sh"
#
# Installs podman, runc and debootstrap from Debian where missing (root), writes a containers.conf that works
# on this kind of VM (runc, not crun, which rejects the hybrid cgroup layout; ulimits the runtime may set),
# and makes sure the Dockerfile's base images exist: pulled when a registry answers, otherwise local stand-ins
# tagged with the official names (debian:bookworm-slim by debootstrap from Debian's packages; rust:1.95-bookworm
# as that plus this machine's own Rust toolchain). Stand-ins are for local tests only: never push them.
# Idempotent; fails loudly (exit 1, saying what is missing) instead of letting a caller skip the image.
set -euo pipefail
W=${CONTAINER_SANDBOX:-/tmp/container-sandbox}
RUST_TAG=${RUST_TAG:-1.95}
die() { echo "container-setup: $*" >&2; exit 1; }
mkdir -p "$W/conf"

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  [[ $(id -u) == 0 ]] || die "podman, runc and debootstrap are needed: apt-get install podman runc debootstrap (as root)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null \
    || die "apt-get install podman runc debootstrap failed"
fi

cat > "$W/conf/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
cat > "$W/conf/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$W/storage"
runroot = "$W/run"
CONF
echo "export CONTAINERS_CONF=$W/conf/containers.conf CONTAINERS_STORAGE_CONF=$W/conf/storage.conf" > "$W/env.sh"
# shellcheck disable=SC1091
source "$W/env.sh"
podman info >/dev/null 2>&1 || die "podman does not run here: $(podman info 2>&1 | tail -n 3)"

# A registry that answers within 60 s gives the real base images; otherwise the stand-ins below.
pulled() { podman image exists "$1" || timeout 60 podman pull -q "$1" >/dev/null 2>&1; }

debian=docker.io/library/debian:bookworm-slim
if ! pulled "$debian"; then
  echo "container-setup: no registry image for $debian: building a stand-in with debootstrap (2-4 min)" >&2
  R="$W/rootfs"; rm -rf "$R"
  debootstrap --variant=minbase bookworm "$R" >/dev/null || die "debootstrap bookworm failed"
  # This machine's extra CA certificates (a TLS-intercepting proxy's), so HTTPS works inside builds.
  mkdir -p "$R/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$R" update-ca-certificates >/dev/null 2>&1 || true
  rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/usr/share/man/* "$R"/usr/share/info/*
  tar --numeric-owner -C "$R" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$debian" >/dev/null
  podman tag "$debian" docker.io/library/debian:bookworm
  rm -rf "$R"
fi

rust=docker.io/library/rust:$RUST_TAG-bookworm
if ! pulled "$rust"; then
  echo "container-setup: no registry image for $rust: a stand-in with this machine's Rust toolchain" >&2
  command -v rustc >/dev/null || die "no rustc here to make the $rust stand-in from"
  C="$W/rust-ctx"; rm -rf "$C"; mkdir -p "$C"
  cp -a "$(rustc --print sysroot)" "$C/toolchain"
  cat > "$C/Dockerfile" <<DOCKER
FROM $debian
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates gcc g++ libc6-dev make pkg-config git \
 && rm -rf /var/lib/apt/lists/*
COPY toolchain /usr/local/rust
ENV PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/usr/local/cargo RUST_VERSION=$(rustc --version | cut -d' ' -f2)
RUN mkdir -p /usr/local/cargo && rustc --version && cargo --version
DOCKER
  podman build -q -t "$rust" -t "docker.io/library/rust:$RUST_TAG" "$C" >/dev/null || die "building the $rust stand-in failed"
  rm -rf "$C"
fi
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | sed 's/^/container-setup: /'
echo "container-setup: ready (source $W/env.sh)"
