import json

import onnx
import pytest

from jointspace_train import bundle, vision_int8


def test_quantize_vision_writes_an_int8_bundle_close_to_the_float_one(repo, tmp_path):
    src = repo / "models" / "fixture-tiny"
    photos = sorted((repo / "tests" / "fixtures" / "images").glob("fixture_*.png"))
    out = tmp_path / "int8"
    m = vision_int8.quantize(src, out, photos[:4], "four fixture images")
    assert m["name"] == "fixture-tiny-int8"
    assert "4 photos: four fixture images" in m["vision"]["quantization"]["calibration"]
    bundle.read(out)  # every file's sha256, shapes
    g = onnx.load(str(out / m["vision"]["onnx"])).graph
    ops = [n.op_type for n in g.node]
    convs = ops.count("Conv")
    assert convs == 13 and ops.count("QuantizeLinear") >= convs and ops.count("DequantizeLinear") >= 2 * convs
    int8 = [i for i in g.initializer if i.data_type == onnx.TensorProto.INT8]
    assert len(int8) >= convs, "every convolution's weights stored in 8 bits"
    # Close to the float graph, not equal to it.
    c = vision_int8.compare(src, out, photos[4:])
    assert 0 < c["feature_difference_mean"] < 0.1, c
    assert c["code_flips_mean"] < 0.2, c
    with pytest.raises(ValueError, match="already quantised"):
        vision_int8.quantize(out, tmp_path / "again", photos[:1], "x")
    # The other files are the source's.
    assert json.loads((out / "bundle.json").read_text())["files"]["text.onnx"] == bundle.read(src).manifest[
        "files"]["text.onnx"]
