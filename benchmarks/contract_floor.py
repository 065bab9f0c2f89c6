"""The least any loop that keeps Lightning's per-step hook contract must run: a reference row for overhead.py.

A user may override each of these, so a compatible framework has to call them on every step: the module's
`optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)` (its default steps the optimizer with the closure),
inside the closure `training_step`, `optimizer_zero_grad` and `backward`, and after the step the callbacks'
`on_train_batch_end`. This loop calls exactly those, on our TrainModule, and nothing else: no device move, no
output checks, no agreement, no logging, no position for a resume, no other hooks. How far it sits above the raw
loop is what the contract itself costs, before anything a framework adds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common import StepClock
    from overhead import Config, Run
    from torch import Tensor
    from torch.utils.data import TensorDataset


def run_contract_floor(dataset: TensorDataset, cfg: Config, clock: StepClock | None = None) -> Run:
    """overhead.py's workload through the contract's hooks only, stamped like every other variant."""
    import time

    from overhead import OursModule, OursStepTimer, Run, make_loader

    module, loader, timer = OursModule(cfg.seed, cfg.lr, False), make_loader(dataset, cfg), OursStepTimer(clock)
    start = time.perf_counter()
    optimizer = module.configure_optimizers()
    module.train()
    for epoch in range(cfg.epochs):
        for batch_idx, batch in enumerate(loader):
            outputs: list[Tensor] = []

            def closure(batch: Any = batch, batch_idx: int = batch_idx, epoch: int = epoch,
                        outputs: list[Tensor] = outputs) -> Tensor:
                loss = module.training_step(batch, batch_idx)
                module.optimizer_zero_grad(epoch, batch_idx, optimizer)
                module.backward(loss)
                outputs.append(loss)
                return loss

            module.optimizer_step(epoch, batch_idx, optimizer, closure)
            timer.on_train_batch_end(None, module, outputs[0].detach(), batch, batch_idx)
    return Run(timer.clock, time.perf_counter() - start)
