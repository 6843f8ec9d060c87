"""TinyContext evaluation harness: Hydra configs, dataset loaders, a runner that drives the real
engine (MemoryEngine save/recall), ir-measures metrics, reports, plots and a config recommender.

Entry point: ``python -m evals.run`` (a Hydra app) or the ``tinycontext-eval`` console script.
"""
