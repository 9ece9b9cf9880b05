"""The Python benches still run (on the tiny fixture bundle) and compare like with like; times are not checked."""
import json

from jointspace_train.evaluation import bench
from jointspace_train.vision.backbones import vgg16


def run(capsys, *argv):
    bench.main(list(argv))
    return json.loads(capsys.readouterr().out)


def test_torch_runs_the_same_graph_as_onnxruntime(repo, capsys):
    r = run(capsys, "check", "--bundle", str(repo / "models/fixture-tiny"),
            "--images", str(repo / "tests/fixtures/images"), "--threads", "1")
    assert r["same"], r


def test_ingest_runs_with_both_frameworks(repo, capsys):
    for fw in ("ort", "torch"):
        r = run(capsys, "ingest", "--framework", fw, "--bundle", str(repo / "models/fixture-tiny"),
                "--images", str(repo / "tests/fixtures/images"), "--n", "3", "--crop", "ten", "--threads", "1")
        assert r["images"] == 3 and r["crop_mode"] == "ten"
        assert set(r["profile"]) == {"decode", "resize_and_crops", "vision", "fne", "projection"}


def test_sgemm_and_the_vgg16_flop_count(repo, capsys):
    r = run(capsys, "sgemm", "--bundle", str(repo / "models/fixture-tiny"), "--size", "64", "--reps", "1",
            "--threads", "1")
    assert r["peak_gflops"] > 0
    # VGG16's conv base at 224x224: 15.35 G multiply-adds.
    convs = [(n, _Shape(c, cin), None) for n, c, cin in _vgg16_shapes()]
    flops = bench.graph_flops(vgg16.VggWeights(convs=convs), 224)
    assert abs(flops / 1e9 - 30.69) < 0.01, flops


class _Shape:
    """Stands in for a weight array: graph_flops reads only the shape."""

    def __init__(self, cout, cin):
        self.shape = (cout, cin, 3, 3)


def _vgg16_shapes():
    cin = 3
    for name, cout in zip(vgg16.conv_names(), [c for b in vgg16.VGG16_BLOCKS for c in b]):
        yield name, cout, cin
        cin = cout
