"""The image side: the backbones and their ImageNet weights, the reference image path, the vision graph run over a
dataset (raw features, the FNE code), its PyTorch twin and its int8 copy."""
