"""Write a model bundle (docs/bundle.md) from a trained model: text ONNX, W, FNE statistics, tokenizer."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from ..training.model import StackedText, TextEncoder
from ..vision import fne
from . import contract


def export_text(text: TextEncoder | StackedText, path: str | Path) -> None:
    """ids [N,T] int64 + lengths [N] int64 -> embedding [N, joint_dim], dynamic N and T.

    The TorchScript exporter is used: it turns nn.GRU (nn.LSTM) into one ONNX GRU (LSTM) node, which the dynamo
    exporter of this torch version mis-names.
    """
    # A narrow (GloVe-width) word table and its learned widening become one table of the words' width.
    text = (StackedText([m.folded() for m in text.members]) if isinstance(text, StackedText)
            else text.folded()).eval()
    ids = torch.tensor([[2, 3, 4], [5, 0, 0]], dtype=torch.int64)
    lengths = torch.tensor([3, 1], dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(text, (ids, lengths), str(path), input_names=["ids", "lengths"],
                          output_names=["embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={"ids": {0: "N", 1: "T"}, "lengths": {0: "N"}, "embedding": {0: "N"}})
    # The exporter leaves the output's width symbolic; state it, so readers can check it against joint_dim.
    model = onnx.load(str(path))
    dim = model.graph.output[0].type.tensor_type.shape.dim[1]
    dim.ClearField("dim_param")
    dim.dim_value = text.joint_dim
    onnx.save(model, str(path))


def write(directory: str | Path, *, name: str, vision: dict, vision_onnx: str | Path, fne_mean, fne_std,
          projection: np.ndarray, text: TextEncoder | StackedText, tok, max_tokens: int, similarity: str,
          use_abs: bool, training: dict, projection_dtype=np.float16) -> dict:
    """Write every file and bundle.json; `vision` is the manifest's vision section (taps, colour order...)."""
    return write_files(directory, name=name, vision=vision, vision_onnx=vision_onnx, fne_mean=fne_mean,
                       fne_std=fne_std, projection=projection, write_text=lambda path: export_text(text, path),
                       tok=tok, max_tokens=max_tokens, similarity=similarity, use_abs=use_abs, training=training,
                       projection_dtype=projection_dtype)


def write_files(directory: str | Path, *, name: str, vision: dict, vision_onnx: str | Path, fne_mean, fne_std,
                projection: np.ndarray, write_text, tok, max_tokens: int, similarity: str, use_abs: bool,
                training: dict, projection_dtype=np.float16, bias: np.ndarray | None = None) -> dict:
    """Any model's bundle: `write_text(path)` writes its text graph, `bias` (optional) is the projection's."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    vision = {"onnx": "vision.onnx", **vision}
    if Path(vision_onnx).resolve() != (d / "vision.onnx").resolve():
        shutil.copyfile(vision_onnx, d / "vision.onnx")
    contract.write_fne(d / "fne.safetensors", fne_mean, fne_std)
    contract.write_projection(d / "projection.safetensors", projection, projection_dtype, bias)
    write_text(d / "text.onnx")
    tok.save(str(d / "tokenizer.json"))
    joint_dim = int(projection.shape[0])
    manifest = {
        "name": name,
        "vision": vision,
        "fne": {"stats": "fne.safetensors", "dim": int(vision["raw_dim"]), "thresholds": list(fne.THRESHOLDS),
                "std_eps": fne.STD_EPS},
        "projection": {"weights": "projection.safetensors", "joint_dim": joint_dim, "abs": bool(use_abs)},
        "text": {"onnx": "text.onnx", "tokenizer": "tokenizer.json", "max_tokens": int(max_tokens),
                 "ids_name": "ids", "lengths_name": "lengths", "output_name": "embedding", "pad_id": 0},
        "similarity": similarity,
        "training": training,
    }
    return contract.finish(d, manifest)
