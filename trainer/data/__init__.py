"""Loaders: which ones a run uses, their lengths and limits, distributed samplers, loader rebuilding,
CombinedLoader, batch transfer and overfit_batches."""
