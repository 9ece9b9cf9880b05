import hashlib

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from jointspace_train.vision import backbones, features, int8
from jointspace_train.vision.backbones import vgg16

SMALL = ((3, 3), (4, 4), (4, 4, 4), (5, 5, 5), (6, 6, 6))


class Arrays(CalibrationDataReader):
    def __init__(self, xs):
        self.left = iter(xs)

    def get_next(self):
        x = next(self.left, None)
        return None if x is None else {"images": x}


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_int8_graph_is_rebuilt_byte_for_byte_from_the_kept_ranges(tmp_path):
    float_graph = tmp_path / "f.onnx"
    backbones.save(vgg16.build_graph(vgg16.random_vgg(SMALL, seed=5), "post_relu"), float_graph)
    rng = np.random.default_rng(0)
    photos = [rng.normal(0, 50, (1, 3, 224, 224)).astype(np.float32) for _ in range(3)]
    ranges = tmp_path / int8.RANGES
    int8.int8_graph(float_graph, tmp_path / "calibrated.onnx", ranges, Arrays(photos))
    assert ranges.stat().st_size > 0, "the calibration kept its ranges"
    assert ranges.stat().st_mode & 0o777 == 0o644, "readable like the bundle's other files"
    # Without photos: only the ranges, as rebuild-vision has them on a fresh machine.
    int8.int8_graph(float_graph, tmp_path / "rebuilt.onnx", ranges)
    assert sha(tmp_path / "rebuilt.onnx") == sha(tmp_path / "calibrated.onnx")
    # And it is an int8 graph that still computes the same features, nearly.
    x = photos[0]
    want = features.session(float_graph).run(None, {"images": x})[0]
    got = features.session(tmp_path / "rebuilt.onnx").run(None, {"images": x})[0]
    assert not np.array_equal(got, want), "the convolutions were not quantised"
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
