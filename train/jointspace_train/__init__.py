"""jointspace trainer: FNE features, caption encoder training, and the model bundle the server loads.

The modules are grouped by stage: `data` (Flickr8k, the preparation's test photos), `vision` (the backbones, the
image path, the FNE code), `text` (the tokenizer, GloVe, caption features and text graphs), `training` (the
joint-space models, their runs, the closed-form fits), `bundle` (what the server loads: its contract, the writers,
the sections added to it, the reference pipeline) and `evaluation` (metrics, tables, benchmarks); `cli` is the
command line over them.

The bundle contract lives in docs/bundle.md; `bundle/contract.py` is its Python side.
"""
