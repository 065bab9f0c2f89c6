"""Checkpoint bytes on disk and on object stores: atomic writes, weights-only loads, integrity checks,
claimed names, temp files, fsspec paths."""
