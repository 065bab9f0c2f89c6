"""Tqdm: the bar ProgressBar draws on a terminal (Lightning's `Tqdm`), in its own module so that tqdm is imported
only when a bar opens, not with `callbacks.progress` (a Trainer builds its default ProgressBar at construction)."""

from __future__ import annotations

from tqdm.auto import tqdm as _tqdm

_WIDTH = 5  # a shown float or numeric string is padded with zeros to at least this many characters


class Tqdm(_tqdm):
    """tqdm with numbers padded to a fixed width: a metric going from 0.5 to 0.25 keeps the bar from shifting.

    Return one from an overridden `ProgressBar.init_train_tqdm` (and the other `init_*_tqdm`) to customise a bar.
    """

    @staticmethod
    def format_num(n: int | float | str) -> str:
        text = n if isinstance(n, str) else _tqdm.format_num(n)
        if isinstance(n, int) or "e" in text:
            return text
        if "." not in text:
            try:
                float(text)
            except ValueError:  # a word (a W&B run id): shown as it is
                return text
            if len(text) < _WIDTH:
                text += "."
        return text + "0" * (_WIDTH - len(text))
