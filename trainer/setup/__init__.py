"""What a run is assembled from before its first batch: the flag table and its checks, the default callbacks
and loggers, the run-start sequence, barebones mode, step signatures and the uncalled-hook check."""
