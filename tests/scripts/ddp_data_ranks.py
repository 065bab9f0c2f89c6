"""Run by tests/compat/test_ddp_data.py on 2 CPU ranks, with FRAMEWORK=lightning (the oracle) or ours: one fit whose
training data is a dict of three loaders (a custom sampler with its own generator, a DataLoader subclass with an
argument of its own that shuffles, and a shorter plain loader), and validation on a custom sampler. Each rank writes
the sample ids every step and validation step saw to OUT/<framework>-rank<r>.json."""

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset, WeightedRandomSampler

if os.environ.get("FRAMEWORK") == "lightning":
    from lightning.pytorch import LightningModule as TrainModule
    from lightning.pytorch import Trainer, seed_everything

    from strategies.launch.shutdown import shutdown_at_exit

    # Lightning's ranks meet torch's gloo exit race (a worker thread asks for the GIL during interpreter finalization:
    # SIGABRT "terminate called without an active exception", docs/reliability.md): the oracle's run gets the same
    # orderly exit ours has, so its exit status says how its fit went
    shutdown_at_exit()
else:
    from trainer import Trainer, TrainModule, seed_everything


def ids(n, offset=0):
    features = torch.randn(n, 4, generator=torch.Generator().manual_seed(n))
    return TensorDataset(torch.arange(offset, offset + n), features)


class TaggedLoader(DataLoader):
    def __init__(self, dataset, tag, **kwargs):
        super().__init__(dataset, **kwargs)
        self.tag = tag


class Reversed(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class Recorder(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(["train", self.current_epoch, batch_idx, {k: v[0].tolist() for k, v in batch.items()}])
        return sum(self.layer(v[1]).pow(2).mean() for v in batch.values())

    def validation_step(self, batch, batch_idx):
        self.seen.append(["val", self.current_epoch, batch_idx, batch[0].tolist()])

    def train_dataloader(self):
        weights = torch.linspace(0.1, 1.0, 10)
        sampler = WeightedRandomSampler(weights, 10, generator=torch.Generator().manual_seed(5))
        return {"custom": DataLoader(ids(10), batch_size=2, sampler=sampler),
                "subclass": TaggedLoader(ids(12, 100), tag="t", batch_size=3, shuffle=True),
                "short": DataLoader(ids(4, 200), batch_size=2)}

    def val_dataloader(self):
        return DataLoader(ids(6, 300), batch_size=2, sampler=Reversed(6))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    framework, out = os.environ.get("FRAMEWORK", "ours"), Path(sys.argv[1])
    seed_everything(42)
    model = Recorder()
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=str(out / framework))
    trainer.fit(model)
    (out / f"{framework}-rank{trainer.global_rank}.json").write_text(json.dumps(model.seen))
