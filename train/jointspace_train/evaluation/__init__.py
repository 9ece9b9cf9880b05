"""Measuring models and bundles: retrieval metrics, a bundle measured from the images, ensembles of runs, the
results tables, the benchmarks (`python -m jointspace_train.evaluation.bench`) and the open-vocabulary benchmark
(`python -m jointspace_train.evaluation.openvocab`)."""
