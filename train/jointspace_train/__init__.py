"""jointspace trainer: FNE features, caption encoder training, and the model bundle the server loads.

The bundle contract lives in docs/bundle.md; `bundle.py` is its Python side.
"""
