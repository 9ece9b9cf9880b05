# jointspace container images. Two targets:
#   cpu  (default, the last stage): Debian slim + ONNX Runtime (CPU) from the onnxruntime wheel
#   cuda: Debian slim + CUDA 13.0's runtime libraries and cuDNN 9 from NVIDIA's PyPI wheels + onnxruntime-gpu,
#         JOINTSPACE_DEVICE=cuda (no CUDA base image needed: scripts/cuda-image-smoke.sh builds and starts it)
#
#   podman build --format docker -t jointspace:cpu .                 # or: docker build -t jointspace:cpu .
#   podman build --format docker --target cuda -t jointspace:cuda .
#   docker run --gpus all -p 8080:8080 jointspace:cuda               # needs the NVIDIA container toolkit
#
# The default bundle goes into the image, including its two vision graphs and GloVe text graph (rebuilt on the host by
# scripts/setup-python.sh and checked against the sha256 in bundle.json when the server loads it).
# `--format docker` keeps the HEALTHCHECK with podman/buildah (OCI images have no health check field).
# Plain RUN lines, no heredocs or COPY --link: buildah 1.28 (Debian 12) must build this too.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
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

# ---- CUDA 13.0 and cuDNN 9 runtime libraries, from NVIDIA's PyPI wheels by exact version and sha256 ----
# onnxruntime-gpu 1.31.1 is built for CUDA 13.0 (its build_and_package_info.py); its CUDA provider links
# libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and libcurand.so.10 (readelf -d) and loads cuDNN 9, whose
# runtime-compiled engines load NVRTC. The versions are CUDA 13.0 update 2's (PyPI cuda-toolkit==13.0.2) and the
# cuDNN that PyTorch 2.11 (cu130) pins, the set the GPU machines of scripts/gpu-check.sh carry. Left out: cuFFT
# (the provider does not link it; no FFT in these graphs), the wheels' Python files and headers, and
# libcuda.so.1, which is the host driver's: the NVIDIA container runtime mounts it (`docker run --gpus all`).
FROM wheels AS cuda-libs
RUN python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 -d . \
      nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88 \
      nvidia-cudnn-cu13==9.19.0.56 \
 && printf '%s  %s\n' \
      7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 \
      nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl \
      ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171 \
      nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl \
      1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc \
      nvidia_curand-10.4.0.35-py3-none-manylinux_2_27_x86_64.whl \
      ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575 \
      nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl \
      d20e1734305e9d68889a96e3f35094d733ff1f83932ebe462753973e53a572bf \
      nvidia_cudnn_cu13-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl \
    | sha256sum -c - \
 && for w in *.whl; do python3 -m zipfile -e "$w" x; done \
 && mkdir -p /opt/cuda/lib \
 && cd x/nvidia/cu13/lib \
 && cp libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libnvrtc-builtins.so.13.0 \
      ../../cudnn/lib/libcudnn*.so.9 /opt/cuda/lib/ \
 && cd /wheels && rm -rf x ./*.whl

# The two final stages repeat their last lines on purpose: one stage on a base picked by an ARG
# (FROM base-${VARIANT}) would be shorter, but buildah 1.28 does not resolve a stage name through an ARG.
# ---- cuda: the CPU image's Debian base, the CUDA libraries above, onnxruntime-gpu; same binary ----
# JOINTSPACE_DEVICE=cuda: without a usable GPU the server exits at start saying why (no silent CPU fallback);
# JOINTSPACE_DEVICE=auto accepts the CPU, with a warning. NVIDIA_* tell the NVIDIA container runtime to mount
# the driver's compute libraries, as NVIDIA's own CUDA images do.
FROM ${DEBIAN_IMAGE} AS cuda
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/jointspace --create-home jointspace
COPY --from=ort-cuda /opt/onnxruntime /opt/onnxruntime
COPY --from=cuda-libs /opt/cuda /opt/cuda
COPY --from=build /usr/local/bin/jointspace /usr/local/bin/jointspace
COPY models/flickr8k-vgg16-effnetl2-fne /opt/jointspace/models/flickr8k-vgg16-effnetl2-fne
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so \
    LD_LIBRARY_PATH=/opt/onnxruntime/lib:/opt/cuda/lib \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    JOINTSPACE_DEVICE=cuda \
    JOINTSPACE_ADDR=0.0.0.0:8080 \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304 \
    JOINTSPACE_BUNDLE=/opt/jointspace/models/flickr8k-vgg16-effnetl2-fne \
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
COPY models/flickr8k-vgg16-effnetl2-fne /opt/jointspace/models/flickr8k-vgg16-effnetl2-fne
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so \
    JOINTSPACE_DEVICE=cpu \
    JOINTSPACE_ADDR=0.0.0.0:8080 \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304 \
    JOINTSPACE_BUNDLE=/opt/jointspace/models/flickr8k-vgg16-effnetl2-fne \
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
