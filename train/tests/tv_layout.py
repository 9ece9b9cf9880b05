"""Weights laid out as a torchvision `vgg16` state dict, for the loader's tests."""
import torch


def torchvision_layout(weights) -> dict:
    """features.N.* for the convs (max-pools take an index slot of their own), classifier.0/3 for fc6/fc7."""
    sd, idx, convs = {}, 0, iter(weights.convs)
    for block in weights.blocks:
        for _ in block:
            _, w, b = next(convs)
            sd[f"features.{idx}.weight"], sd[f"features.{idx}.bias"] = torch.from_numpy(w), torch.from_numpy(b)
            idx += 2
        idx += 1
    for (_, w, b), k in zip(weights.fcs, (0, 3)):
        sd[f"classifier.{k}.weight"], sd[f"classifier.{k}.bias"] = torch.from_numpy(w), torch.from_numpy(b)
    return sd
