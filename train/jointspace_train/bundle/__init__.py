"""The model bundle (docs/bundle.md): its contract, the bundles written from trained models or runs, the sections
added to a bundle (hubness, labels) or rewritten in one (the vision graph), its end-to-end reference pipeline and
the tiny fixture bundle."""
