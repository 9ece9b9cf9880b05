import json

import pytest
import torch

from jointspace_train.cli import main
from jointspace_train.training import transfer
from jointspace_train.training.model import ImageProjection, TextEncoder


def finished_run(path, vocab=50, word=6, joint=12):
    torch.manual_seed(0)
    proj, text = ImageProjection(20, joint), TextEncoder(vocab, word, joint, layers=2)
    path.mkdir()
    torch.save({"proj": proj.state_dict(), "text": text.state_dict()}, path / "model.pt")
    (path / "result.json").write_text(json.dumps({"settings": {"joint_dim": joint}, "dev": {"rsum": 1.5}}))
    return proj, text


def test_a_run_goes_through_parts_and_comes_back_rounded_as_promised(tmp_path):
    proj, text = finished_run(tmp_path / "run")
    parts = transfer.split_run(tmp_path / "run", tmp_path / "parts", part_bytes=1000)
    assert len(parts) > 1 and all(p.stat().st_size <= 1000 for p in parts)
    main(["join-run", str(tmp_path / "parts"), "--run-dir", str(tmp_path / "back")])
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=True)
    assert json.loads((tmp_path / "back" / "result.json").read_text())["dev"] == {"rsum": 1.5}
    assert back["proj"].keys() == proj.state_dict().keys() and back["text"].keys() == text.state_dict().keys()
    for name, v in text.state_dict().items():
        got = back["text"][name]
        assert got.dtype == torch.float32 and got.shape == v.shape
        if name == "embed.weight":
            # each row: int8 steps of max|row| / 127, as quantize-text's int8 table
            step = v.abs().amax(dim=1, keepdim=True) / 127
            assert torch.all((got - v).abs() <= step / 2 + 1e-7)
            assert torch.allclose(got / step, (got / step).round(), atol=1e-4)
        else:
            assert torch.equal(got, v.half().float())
    assert torch.equal(back["proj"]["fc.weight"], proj.state_dict()["fc.weight"].half().float())


def test_an_unfinished_run_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="not a finished run"):
        main(["split-run", str(tmp_path / "run"), "--out", str(tmp_path / "parts")])
    with pytest.raises(SystemExit, match="split-run's output"):
        main(["join-run", str(tmp_path / "run"), "--run-dir", str(tmp_path / "back")])
