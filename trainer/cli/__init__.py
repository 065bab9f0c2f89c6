"""The command lines: `python -m trainer fit|validate|test|predict|consolidate` and Lightning's `LightningCLI`.

Importing this package imports omegaconf; `import trainer` does not import it.
"""


from strategies.from_lightning import package_lookups
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


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "trainer.from_lightning")
