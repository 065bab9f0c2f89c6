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


README = DOCS.parent / "README.md"


def test_readme_set_up_block_has_exactly_the_two_commands():
    block = re.search(r"## Set up\n.*?```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]


def test_readme_links_every_guide():
    text = README.read_text()
    for guide in ("tutorial", "from-raw-ddp", "from-lightning", "strategies"):
        assert f"(docs/{guide}.md)" in text and (DOCS / f"{guide}.md").is_file()
