"""`python -m trainer fit --config run.yaml ...`: the command line of trainer/cli/command.py.

Kept apart from `trainer/__init__.py` so that `import trainer` never loads the CLI (nor omegaconf).
The DDP launcher re-runs `python -m trainer ...` with the same arguments for the other local ranks.
"""

from trainer.cli import main

if __name__ == "__main__":
    main()
