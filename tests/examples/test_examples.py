"""The examples run as documented: each script in a subprocess with a short setting (the sync-SGD comparison for
real, on 2 CPU ranks), and each YAML config in examples/configs through the CLI with fast_dev_run.

Subprocesses go through tests/helpers/launch.py's `launch`: a hard wall-clock limit, and every process a
script started (Trainer-launched ranks, torch.multiprocessing children) must be gone when it returns.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import Finished, launch
from tests.helpers.launch import clean_env as _env
from trainer.cli import run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launch harness reads /proc")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # trainer.cli.run() adds the working directory


def _run_example(name: str, *args: str, out: Path, timeout: float) -> Finished:
    cmd = [sys.executable, str(EXAMPLES / name), *args]
    (res,) = launch([(cmd, _env())], out, timeout=timeout)
    assert res.returncode == 0, f"{name} exited with {res.returncode}:\n{res.output[-6000:]}"
    return res


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_sync_sgd_by_hand_equals_trainer_ddp(tmp_path: Path):
    res = _run_example("sync_sgd.py", "--devices", "2", "--strategy", "ddp", out=tmp_path / "out", timeout=120)
    diffs = re.findall(r"max abs difference: (\S+)", res.output)
    assert len(diffs) == 1, f"expected one comparison (rank 0 only):\n{res.output[-4000:]}"
    assert float(diffs[0]) <= 1e-6, res.output[-4000:]


@pytest.mark.timeout(120)
def test_resnet_fast_dev_run(tmp_path: Path):
    res = _run_example("resnet.py", "--accelerator", "cpu", "--fast-dev-run", "--batch-size", "4", "--num-train",
                       "16", "--no-progress-bar", "--root", str(tmp_path / "root"), out=tmp_path / "out", timeout=100)
    (metrics,) = re.findall(r"final metrics: (.*)", res.output)
    assert all(key in metrics for key in ("'train_loss'", "'train_acc'", "'val_loss'", "'val_acc'")), metrics


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_gpt_zero3_bf16_on_two_cpu_ranks(tmp_path: Path):
    root = tmp_path / "root"
    res = _run_example("gpt.py", "--accelerator", "cpu", "--devices", "2", "--strategy", "zero3", "--precision",
                       "bf16-mixed", "--fast-dev-run", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                       "--block-size", "32", "--batch-size", "4", "--sample-chars", "20", "--no-progress-bar",
                       "--root", str(root), out=tmp_path / "out", timeout=120)
    samples = re.findall(r"--- sample ---\n(.*?)\n--------------", res.output, re.S)  # a sample may hold newlines
    assert len(samples) == 1 and samples[0].startswith("The Trainer ") and len(samples[0]) == 32, res.output[-4000:]
    assert (root / "final-weights.ckpt").is_file()


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_gpt_model_parallel_on_two_cpu_ranks(tmp_path: Path):
    """Tensor parallelism over 2 ranks: every block's heads and MLP split by the module's configure_model; the
    final weights gathered into one file load into a plain module that samples."""
    root = tmp_path / "root"
    res = _run_example("gpt.py", "--accelerator", "cpu", "--devices", "2", "--strategy", "model_parallel",
                       "--fast-dev-run", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
                       "--batch-size", "4", "--sample-chars", "20", "--no-progress-bar", "--root", str(root),
                       out=tmp_path / "out", timeout=120)
    samples = re.findall(r"--- sample ---\n(.*?)\n--------------", res.output, re.S)
    assert len(samples) == 1 and samples[0].startswith("The Trainer ") and len(samples[0]) == 32, res.output[-4000:]
    assert "ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2" in res.output, res.output[-4000:]


@pytest.mark.timeout(120)
def test_gan_fast_dev_run_prints_digits(tmp_path: Path):
    res = _run_example("gan.py", "--accelerator", "cpu", "--strategy", "ddp", "--devices", "2",  # manual under DDP
                       "--fast-dev-run", "--hidden", "16", "--no-progress-bar",
                       "--root", str(tmp_path / "root"), out=tmp_path / "out", timeout=100)
    art = res.output.split("generated digits:\n", 1)[1].splitlines()[:8]
    assert len(art) == 8 and all(len(row) == 6 * 16 + 5 * 2 for row in art), res.output[-4000:]


# --- the YAML configs through the CLI (in process: no launch needed for one device) -------------------------
TINY = {  # overrides that make each config's model and data tiny
    "resnet": ["data.init_args.batch_size=4", "data.init_args.num_train=16", "data.init_args.num_val=8"],
    "gpt": ["model.init_args.n_layer=1", "model.init_args.n_head=2", "model.init_args.n_embd=32",
            "model.init_args.block_size=32", "data.init_args.batch_size=4"],
    "gan": ["model.init_args.hidden=16", "data.init_args.batch_size=8"],
}
EXPECTED = {"resnet": ("ResNetClassifier", "SyntheticImages", 1), "gpt": ("GPTModule", "DocsText", 1),
            "gan": ("DigitsGAN", "DigitImages", 2)}  # manual optimization: each optimizer.step() is a step


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(TINY))
def test_config_fast_dev_run(name: str):
    config = str(EXAMPLES / "configs" / f"{name}.yaml")
    out = run(["fit", "--config", config, "trainer.fast_dev_run=true", "trainer.accelerator=cpu",
               "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
               f"trainer.default_root_dir={name}", *TINY[name]])
    module, data, steps = EXPECTED[name]
    assert (type(out.model).__name__, type(out.datamodule).__name__, out.trainer.global_step) == (module, data, steps)
    assert Path(name, "config.yaml").is_file()


@pytest.mark.timeout(120)
def test_digits_find_lr_trains_with_the_suggestion(tmp_path: Path):
    res = _run_example("digits.py", "--find-lr", "--max-epochs", "1", "--no-progress-bar", "--root", str(tmp_path),
                       out=tmp_path, timeout=110)
    suggestion = float(re.search(r"lr_find suggestion:\s+(\S+)", res.output).group(1))
    assert 1e-5 < suggestion < 1.0
    assert (tmp_path / "lr_find.png").stat().st_size > 0
