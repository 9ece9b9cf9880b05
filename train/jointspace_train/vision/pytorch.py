"""The VGG16 vision graph of `backbones.vgg16.build_graph`, in PyTorch: the same layers and taps, to run feature
extraction on a GPU (a machine that has PyTorch and CUDA but not ONNX Runtime's CUDA provider).

Computed in float32 with TF32 off, so its features match the ONNX graph's on the CPU to float32 rounding
(tests/test_vision.py compares the two); the ternary codes made from them differ only where a z-score sits
on a threshold.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .backbones.vgg16 import TAP_POINTS, VggWeights


class VisionNet(nn.Module):
    """[N, 3, S, S] float32 -> [N, raw_dim]: the spatial mean of every conv layer (and fc6/fc7 when present),
    pre-ReLU, post-ReLU or both (every pre-ReLU tap, then every post-ReLU tap), as `build_graph` orders them."""

    def __init__(self, weights: VggWeights, tap_point: str = "post_relu", taps: str = "all"):
        super().__init__()
        if tap_point not in TAP_POINTS:
            raise ValueError(f"tap_point must be one of {TAP_POINTS}")
        if taps not in ("all", "last"):
            raise ValueError("taps must be 'all' or 'last'")
        self.tap_point, self.taps = tap_point, taps
        self.convs = nn.ModuleList()
        for _, w, b in weights.convs:
            conv = nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1)
            conv.weight.data = torch.from_numpy(np.ascontiguousarray(w))
            conv.bias.data = torch.from_numpy(np.ascontiguousarray(b))
            self.convs.append(conv)
        self.fcs = nn.ModuleList()
        for _, w, b in weights.fcs:
            fc = nn.Linear(w.shape[1], w.shape[0])
            fc.weight.data = torch.from_numpy(np.ascontiguousarray(w))
            fc.bias.data = torch.from_numpy(np.ascontiguousarray(b))
            self.fcs.append(fc)
        self.block_ends = set(int(i) for i in np.cumsum([len(b) for b in weights.blocks]) - 1)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre, post = [], []
        for i, conv in enumerate(self.convs):
            y = conv(x)
            x = torch.relu(y)
            pre.append(y.mean(dim=(2, 3)))
            post.append(x.mean(dim=(2, 3)))
            if i in self.block_ends:
                x = nn.functional.max_pool2d(x, 2, 2)
        if len(self.fcs):
            x = x.flatten(1)
            for fc in self.fcs:
                y = fc(x)
                x = torch.relu(y)
                pre.append(y)
                post.append(x)
        if self.taps == "last":
            pre, post = pre[-1:], post[-1:]
        chosen = {"pre_relu": pre, "post_relu": post, "both": pre + post}[self.tap_point]
        return torch.cat(chosen, dim=1)


def runner(weights: VggWeights, tap_point: str, device: str = "cuda", bf16: bool = False, threads: int = 0):
    """A function taking the graph's input (numpy [N, 3, S, S] float32) to its output (numpy [N, raw_dim]
    float32), as an ONNX Runtime session's run would, on `device` (`threads`: PyTorch's CPU threads, 0 its own).

    `bf16` runs the convolutions in bfloat16 (channels-last, where oneDNN uses AMX on a CPU that has it: about
    3x float32 on one core); the spatial means come back as float32 but carry bfloat16's rounding, so such
    features are cached apart from the exact ones (`features.extract`'s tag)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    layout = torch.channels_last if bf16 else torch.contiguous_format
    net = VisionNet(weights, tap_point).to(device, memory_format=layout).eval()

    def run(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(x).to(device, memory_format=layout)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            return net(t).float().cpu().numpy()

    return run
