"""A script written on LightningCLI, run by tests/test_lightning_cli.py: with FRAMEWORK=lightning it imports
Lightning 2.x (the oracle), otherwise ours, by renaming the imports only. `--out=PATH` saves the trained weights and a
JSON summary after fit (an argument the script declares itself)."""

import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("FRAMEWORK") == "lightning":
    from lightning.pytorch import LightningDataModule as DataModule
    from lightning.pytorch import LightningModule as TrainModule
    from lightning.pytorch.cli import LightningCLI
else:
    from trainer import DataModule, TrainModule
    from trainer.cli import LightningCLI


class Net(TrainModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1, num_classes: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, num_classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(DataModule):
    def __init__(self, batch_size: int = 16, n: int = 64) -> None:
        super().__init__()
        self.batch_size, self.n, self.num_classes = batch_size, n, 3
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 1).long()

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)


class CLI(LightningCLI):
    """The hooks a real script overrides: a link from the data to the model, an extra argument, after_fit."""

    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.add_argument("--out", default="")

    def after_fit(self):
        out = self._get_out()
        if out:
            torch.save({k: v.detach().clone() for k, v in self.model.state_dict().items()}, out)
            with open(out + ".json", "w") as f:
                json.dump({"global_step": self.trainer.global_step,
                           "hparams": dict(self.model.hparams),
                           "metrics": {k: float(v) for k, v in self.trainer.callback_metrics.items()}}, f)

    def _get_out(self):
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        return cfg.get("out")


def main(args=None, run=True, **kwargs):
    defaults = {"enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu"}
    return CLI(Net, Data, seed_everything_default=7, trainer_defaults=defaults, args=args, run=run, **kwargs)


if __name__ == "__main__":
    main()
