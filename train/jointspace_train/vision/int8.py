"""A bundle's vision graph with int8 convolutions (`python -m jointspace_train quantize-vision BUNDLE --out DIR`).

The CNN is nearly all of ingest and its float32 convolutions already run near this CPU's peak (docs/benchmarks.md),
so cheaper arithmetic is one of the few levers left. ONNX Runtime's static QDQ quantisation rewrites every Conv
to take 8-bit weights (symmetric, one scale per output channel) and 8-bit activations (asymmetric, one scale per
tensor, from the minimum and maximum seen on calibration photos), which its CPU kernels run with VNNI where the
CPU has it. Everything else (ReLU, pooling, the taps' means) stays float32, so the graph keeps the contract:
same input, same `features` output. The result is another bundle, named and described as int8, never a silent
swap: its codes differ from the float graph's in a few percent of features (`compare` says how many).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..bundle import contract
from . import features, images


def calibration_photos(data: str | Path, n: int, seed: int = 0) -> list[Path]:
    """`n` photos of the training split, drawn with `seed`."""
    d = Path(data)
    names = (d / "Flickr_8k.trainImages.txt").read_text().split()
    return [d / "images" / name for name in np.random.default_rng(seed).choice(names, n, replace=False)]


#: The calibration's per-tensor ranges, kept in the bundle: with them the int8 graph is rebuilt from the float
#: graph alone (rebuild-vision), byte for byte, on a machine without the calibration photos.
RANGES = "vision-calibration.json"


def quantize(src: str | Path, out: str | Path, photos: list[Path], source: str, name: str | None = None) -> dict:
    """Writes `out`: `src` with its vision graph's convolutions in int8, calibrated on `photos`; named `name`, or
    `src`'s name with "-int8"."""
    from onnxruntime.quantization import CalibrationDataReader

    src, out = Path(src), Path(out)
    m = json.loads((src / "bundle.json").read_text())
    v = m["vision"]
    if v.get("quantization"):
        raise ValueError(f"{src}: its vision graph is already quantised")
    m = contract.copy_except_vision(src, out, m)
    v = m["vision"]

    class Photos(CalibrationDataReader):
        def __init__(self):
            self.left = iter(photos)

        def get_next(self):
            p = next(self.left, None)
            return None if p is None else {v["input_name"]: images.preprocess(str(p), v)}

    (out / RANGES).unlink(missing_ok=True)
    int8_graph(src / v["onnx"], out / v["onnx"], out / RANGES, Photos())
    v["quantization"] = {"convolutions": "int8 weights per output channel, uint8 activations per tensor (QDQ)",
                         "calibration": f"min/max over {len(photos)} photos: {source}", "ranges": RANGES}
    m["name"] = name or f"{m['name']}-int8"
    return contract.finish(out, m)


def int8_graph(float_graph: Path, out: Path, ranges: Path, photos=None) -> None:
    """`float_graph` with int8 convolutions at `out`: calibrated on `photos` (which writes `ranges`), or, without
    them, from the `ranges` an earlier calibration wrote."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out.with_suffix(".pre.onnx")
    quant_pre_process(str(float_graph), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), photos, quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=["Conv"],
                    calibration_cache_path=str(ranges))
    pre.unlink()
    ranges.chmod(0o644)  # onnxruntime writes it owner-only; it is a bundle file like the others


def compare(float_dir: str | Path, int8_dir: str | Path, photos: list[Path]) -> dict:
    """How far the int8 graph's features and codes are from the float graph's on `photos`."""
    b = contract.read(float_dir)
    v = b.manifest["vision"]
    graph = v["onnx"]
    return features.compare_graphs(v, b.manifest["fne"], b.fne_mean, b.fne_std, (Path(float_dir) / graph,
                                   v["crop_mode"]), (Path(int8_dir) / graph, v["crop_mode"]), photos)
