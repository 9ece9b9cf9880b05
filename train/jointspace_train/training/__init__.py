"""Fitting the joint space on the cached features: the model inputs, the trained models (encoders, losses, the
training loop, a run dir), the closed-form systems and their selection, and packs and parts to train elsewhere."""
