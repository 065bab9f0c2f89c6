"""Import hygiene: `import trainer` stays light, and `strategies` stays a leaf package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("tensorboard", "omegaconf", "tqdm", "torchmetrics", "lightning", "rich")
# the optional integrations: imported when a logger starts its run or a URL is used, never by `import trainer`
OPTIONAL = ("mlflow", "wandb", "fsspec", "s3fs", "boto3", "botocore", "aiobotocore", "moto")


def _modules_after(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=ROOT)  # this checkout's packages, not whichever one is installed
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
def test_import_trainer_loads_no_heavy_optional_dependency():
    # torch.hub itself imports tqdm when it is installed, so we compare against a bare `import torch`.
    result = _modules_after(
        "import sys, json, torch\n"
        "before = set(sys.modules)\n"
        "import trainer, callbacks, trainer.loggers\n"
        "from trainer import Trainer, TrainModule, DataModule, seed_everything, rank_zero_only\n"
        "new = sorted(set(sys.modules) - before)\n"
        "print(json.dumps({'new': new, 'all': sorted(sys.modules)}))"
    )
    new_heavy = [m for m in result["new"] if m.split(".")[0] in HEAVY]
    assert new_heavy == []
    for name in ("tensorboard", "omegaconf", "torchmetrics", "lightning", "rich"):
        assert name not in result["all"]


@pytest.mark.subprocess
def test_loggers_and_local_paths_load_no_optional_integration():
    # building the tracking loggers and a local ModelCheckpoint, and resolving local paths, imports none of them
    result = _modules_after(
        "import sys, json, torch\n"
        "before = set(sys.modules)\n"
        "import trainer\n"
        "from trainer.loggers import MLFlowLogger, WandbLogger\n"
        "from callbacks import ModelCheckpoint\n"
        "from strategies.checkpoint_io.filesystem import to_path\n"
        "MLFlowLogger(tracking_uri='http://127.0.0.1:1'); WandbLogger(offline=True)\n"
        "ModelCheckpoint(dirpath='ckpts'); to_path('runs/x')\n"
        "new = sorted(set(sys.modules) - before)\n"
        "print(json.dumps({'new': new, 'all': sorted(sys.modules)}))"
    )
    assert [m for m in result["new"] if m.split(".")[0] in OPTIONAL] == []


@pytest.mark.subprocess
def test_strategies_is_a_leaf_package():
    result = _modules_after(
        "import sys, json\nimport strategies\nprint(json.dumps(sorted(sys.modules)))"
    )
    assert not [m for m in result if m.split(".")[0] in ("trainer", "callbacks")]


def test_public_names_import():
    from callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint, ProgressBar  # noqa: F401
    from strategies import SingleDeviceStrategy, Strategy  # noqa: F401
    from trainer import DataModule, Trainer, TrainModule, rank_zero_only, seed_everything  # noqa: F401
    from trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger  # noqa: F401


@pytest.mark.subprocess
def test_callbacks_names_load_on_first_use():
    """`callbacks` imports each name's module when it is first used: every exported name resolves, and importing one
    callback loads no other callback module (time to first step)."""
    code = ("import sys, callbacks; from callbacks import Timer; import callbacks.base; "
            "print(sorted(m for m in sys.modules if m.startswith('callbacks.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['callbacks.base', 'callbacks.timer']"
    import callbacks

    assert callbacks.__all__ == sorted(callbacks.__all__) and set(dir(callbacks)) >= set(callbacks.__all__)
    for name in callbacks.__all__:
        assert getattr(callbacks, name).__name__ == name


@pytest.mark.subprocess
def test_a_trainer_imports_only_the_callback_modules_it_uses(tmp_path):
    """Time to first step: a fit without the default callbacks loads no callback module, and the defaults load
    theirs only (no rich ones beside the plain progress bar)."""
    result = _modules_after(
        "import sys, json, torch\n"
        "from trainer import Trainer, TrainModule\n"
        "class Net(TrainModule):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.layer = torch.nn.Linear(2, 1)\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.layer(batch).sum()\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.1)\n"
        "data = torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)\n"
        f"flags = dict(accelerator='cpu', devices=1, max_steps=1, default_root_dir={str(tmp_path)!r})\n"
        "Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,\n"
        "        **flags).fit(Net(), data)\n"
        "bare = sorted(m for m in sys.modules if m.split('.')[0] == 'callbacks')\n"
        "Trainer(logger=False, **flags).fit(Net(), data)\n"
        "print(json.dumps({'bare': bare, 'default': sorted(m for m in sys.modules if m.startswith('callbacks'))}))"
    )
    assert result["bare"] == []
    assert result["default"] == ["callbacks", "callbacks.base", "callbacks.checkpoint", "callbacks.checkpoint_files",
                                 "callbacks.checkpoint_names", "callbacks.model_summary", "callbacks.progress",
                                 "callbacks.progress_base"]
