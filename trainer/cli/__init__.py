"""The command lines: `python -m trainer fit|validate|test|predict|consolidate` and Lightning's `LightningCLI`.

Importing this package imports omegaconf; `import trainer` does not import it.
"""

from typing import Any

from trainer.cli.command import (
    CLIError,
    CLIRun,
    LightningArgumentParser,
    LightningCLI,
    ReduceLROnPlateau,
    SaveConfig,
    SaveConfigCallback,
    main,
    run,
)

__all__ = ["CLIError", "CLIRun", "LightningArgumentParser", "LightningCLI", "ReduceLROnPlateau", "SaveConfig",
           "SaveConfigCallback", "main", "run"]


def __getattr__(name: str) -> Any:
    """Lightning's names (trainer/from_lightning.py): resolved on first use, or an error naming what to use."""
    from strategies.from_lightning import resolve
    from trainer.from_lightning import TABLES

    value = resolve(__name__, TABLES[__name__], name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    from strategies.from_lightning import names_here
    from trainer.from_lightning import TABLES

    return sorted({*globals(), *names_here(TABLES[__name__])})
