# jointspace container images. Two targets:
#   cpu  (default, the last stage): Debian slim + ONNX Runtime (CPU) from the onnxruntime wheel
#   cuda: NVIDIA's CUDA 13 + cuDNN 9 runtime + onnxruntime-gpu, JOINTSPACE_DEVICE=cuda
#
#   podman build --format docker -t jointspace:cpu .                 # or: docker build -t jointspace:cpu .
#   podman build --format docker --target cuda -t jointspace:cuda .
#   docker run --gpus all -p 8080:8080 jointspace:cuda               # needs the NVIDIA container toolkit
#
# The default bundle goes into the image, including its vision.onnx (rebuilt on the host by
# scripts/setup-python.sh and checked against the sha256 in bundle.json when the server loads it).
# `--format docker` keeps the HEALTHCHECK with podman/buildah (OCI images have no health check field).
# Plain RUN lines, no heredocs or COPY --link: buildah 1.28 (Debian 12) must build this too.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
# onnxruntime-gpu 1.31.1's CUDA provider links libcudart.so.13, libcublas.so.13 and libcublasLt.so.13 (readelf -d
# on libonnxruntime_providers_cuda.so from the wheel) and loads cuDNN 9: a CUDA 12 image cannot run it.
ARG CUDA_IMAGE=docker.io/nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04
ARG ORT_VERSION=1.31.1

# ---- build: the release binary (cache mounts keep the registry and target/ between builds) ----
# The COPY lines are exactly what the build reads: the workspace's manifests and lock, its crates, the server's
# sources, the search page it embeds (web/) and the bench sources the manifest names. tests/it/container.rs
# fails when a file the binary is built from (cargo's dep-info) is not copied here or is left out of the
# context by .dockerignore, and scripts/test.sh builds this image on every change.
# COPY keeps the files' mtimes, which can be older than a cached target/ built from other sources; the touch
# makes cargo rebuild the workspace's own crates (dependencies stay cached).
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY src src
COPY web web
# Not built here, but Cargo.toml names the bench target, and cargo refuses a manifest whose target is missing.
COPY benches benches
RUN --mount=type=cache,id=jointspace-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=jointspace-target,target=/src/target \
    find crates src web -type f -exec touch {} + \
 && cargo build --release --locked --bin jointspace \
 && cp target/release/jointspace /usr/local/bin/jointspace

# ---- ONNX Runtime's shared libraries, taken from the PyPI wheels (what the server loads with load-dynamic) ----
FROM ${DEBIAN_IMAGE} AS wheels
ARG ORT_VERSION
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /wheels

FROM wheels AS ort-cpu
ARG ORT_VERSION
RUN python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 "onnxruntime==${ORT_VERSION}" -d . \
 && python3 -m zipfile -e onnxruntime-*.whl x \
 && mkdir -p /opt/onnxruntime/lib && cp -a x/onnxruntime/capi/libonnxruntime*.so* /opt/onnxruntime/lib/ \
 && ln -s "libonnxruntime.so.${ORT_VERSION}" /opt/onnxruntime/lib/libonnxruntime.so && rm -rf x *.whl

FROM wheels AS ort-cuda
ARG ORT_VERSION
RUN python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 "onnxruntime-gpu==${ORT_VERSION}" -d . \
 && python3 -m zipfile -e onnxruntime_gpu-*.whl x \
 && mkdir -p /opt/onnxruntime/lib && cp -a x/onnxruntime/capi/libonnxruntime*.so* /opt/onnxruntime/lib/ \
 && ln -s "libonnxruntime.so.${ORT_VERSION}" /opt/onnxruntime/lib/libonnxruntime.so && rm -rf x *.whl

# The two final stages repeat their last lines on purpose: one stage on a base picked by an ARG
# (FROM base-${VARIANT}) would be shorter, but buildah 1.28 does not resolve a stage name through an ARG.
# ---- cuda: unbuilt on the project's machines (no CUDA base image there); same binary, CUDA provider ----
# JOINTSPACE_DEVICE=cuda: without a usable GPU the server exits at start saying why (no silent CPU fallback);
# JOINTSPACE_DEVICE=auto accepts the CPU, with a warning.
FROM ${CUDA_IMAGE} AS cuda
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/jointspace --create-home jointspace
COPY --from=ort-cuda /opt/onnxruntime /opt/onnxruntime
COPY --from=build /usr/local/bin/jointspace /usr/local/bin/jointspace
COPY models/flickr8k-vgg16-fne /opt/jointspace/models/flickr8k-vgg16-fne
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so \
    LD_LIBRARY_PATH=/opt/onnxruntime/lib \
    JOINTSPACE_DEVICE=cuda \
    JOINTSPACE_ADDR=0.0.0.0:8080 \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304 \
    JOINTSPACE_BUNDLE=/opt/jointspace/models/flickr8k-vgg16-fne \
    JOINTSPACE_DATABASE_URL=sqlite:///var/lib/jointspace/jointspace.db \
    JOINTSPACE_LOG_JSON=1
USER 10001:10001
WORKDIR /var/lib/jointspace
VOLUME /var/lib/jointspace
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/readyz >/dev/null || exit 1
ENTRYPOINT ["/usr/local/bin/jointspace"]
CMD ["serve"]

# ---- cpu (default) ----
FROM ${DEBIAN_IMAGE} AS cpu
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/jointspace --create-home jointspace
COPY --from=ort-cpu /opt/onnxruntime /opt/onnxruntime
COPY --from=build /usr/local/bin/jointspace /usr/local/bin/jointspace
COPY models/flickr8k-vgg16-fne /opt/jointspace/models/flickr8k-vgg16-fne
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so \
    JOINTSPACE_DEVICE=cpu \
    JOINTSPACE_ADDR=0.0.0.0:8080 \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304 \
    JOINTSPACE_BUNDLE=/opt/jointspace/models/flickr8k-vgg16-fne \
    JOINTSPACE_DATABASE_URL=sqlite:///var/lib/jointspace/jointspace.db \
    JOINTSPACE_LOG_JSON=1
USER 10001:10001
WORKDIR /var/lib/jointspace
VOLUME /var/lib/jointspace
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/readyz >/dev/null || exit 1
ENTRYPOINT ["/usr/local/bin/jointspace"]
CMD ["serve"]
