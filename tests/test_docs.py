"""The documentation's complete example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_quick_start_example_runs(capsys):
    text = (DOCS / "index.md").read_text()
    block = re.search(r"## A complete example\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "docs/index.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.current_epoch == 10 and float(trainer.callback_metrics["val_loss"]) < 1.0
    assert Path(trainer.checkpoint_callback.best_model_path).is_file()
