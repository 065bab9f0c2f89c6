"""The command lines: `python -m trainer fit|validate|test|predict|consolidate` and Lightning's `LightningCLI`.

Importing this package imports omegaconf; `import trainer` does not import it.
"""

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
