"""Checkpoint save and load time: our durable atomic save and safe load vs bare torch, at about 100 MB.

The payload is shaped like a real checkpoint: the state_dict of an MLP (4 x Linear(1448, 1448), 8.39 M float32
parameters, 33.6 MB) plus an Adam-like optimizer state (exp_avg and exp_avg_sq per parameter, a step count and
param_groups), 100.7 MB of tensors in all, with the few primitives a checkpoint carries beside them.

Save, same dict, same directory, each call writing a file that does not exist yet:
  - ours:             `strategies.checkpoint_io.atomic_file.atomic_save(obj, path)` (temp file in the same directory,
                      flush, fsync, os.replace, fsync of the directory)
  - durable baseline: `torch.save` into an open file, flush, `os.fsync` (what "the bytes are on disk" costs)
  - bare torch.save:  `torch.save(obj, path)`, no fsync (the data may still sit in the page cache)
The <= 1.10x target is ours / durable baseline. Bare torch.save is shown beside it: the gap between the two
baselines is the price of durability itself, which no correct atomic save can avoid.

Load, the file written by torch.save (served from the page cache, as after a recent save):
  - ours:     `strategies.checkpoint_io.safe_load.safe_load(path)` (existence checks, every zip entry checked against
              its CRC-32, then weights_only=True, map_location="cpu", memory-mapped)
  - baseline: `torch.load(path, weights_only=True)`
The <= 1.10x target applies here too (integrity included). Because our load memory-maps the file, its tensors'
pages are copied later, when they go into the model: the "load + copy" rows add that copy (a clone of every
tensor, what load_state_dict costs) to both sides, so the integrity check is not hidden in a lazy read.

Trainer level: a whole `Trainer.save_checkpoint(path)` of a model of that size, after one fitted Adam step
(dump_checkpoint: state dicts, loop state, RNG, the weights-only-safety walk, then atomic_save), vs torch.save
of its model and optimizer state dicts, bare and durable (the same <= 1.10x target against the durable one),
and Lightning's `trainer.save_checkpoint` of the same model after the same step when Lightning is installed
(it writes through a BytesIO and fsspec, without fsync).

On a local S3 server: our atomic save and load vs the plain fsspec client (benchmarks/checkpoint_s3.py says
how); skipped with a note when s3fs or moto is missing, always with `--no-s3`.

Variants run interleaved: each round runs every variant once, in an order rotated by one each round (and
reversed every other cycle), so no variant always goes first. Between calls (outside the timing) the written
file is removed and `os.sync()` flushes any dirty pages, so a bare torch.save does not leave write-back work to
the next variant. Medians in ms; the ratio column is median(ours) / median(baseline); the JSON also holds the
median of per-round paired ratios. The machine this was written on is a shared 2-core VM: run it twice.

    .venv/bin/python benchmarks/checkpoint.py            # full run: 100.7 MB, 11 rounds (about a minute)
    .venv/bin/python benchmarks/checkpoint.py --quick    # smoke run: 12.6 MB, 3 rounds (< 60 s)
"""
# ruff: noqa: E402 - the S3 rows' module is imported by bare name, like common

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import checkpoint_s3
import torch
from common import figure, lightning_version, machine_info, paired, write_result
from torch import nn

from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.checkpoint_io.safe_load import safe_load

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "checkpoint.json"


def make_net(width: int, layers: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def make_checkpoint(width: int) -> dict[str, Any]:
    """A checkpoint-shaped dict: model state_dict + Adam-like state (2 moments per parameter) + primitives."""
    net = make_net(width)
    state_dict = {k: v.detach().clone() for k, v in net.state_dict().items()}
    names = list(state_dict)
    gen = torch.Generator().manual_seed(1)
    optim_state = {
        i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(state_dict[n].shape, generator=gen),
            "exp_avg_sq": torch.rand(state_dict[n].shape, generator=gen)}
        for i, n in enumerate(names)
    }
    return {
        "format_version": 1,
        "state_dict": state_dict,
        "optimizer_states": [{"state": optim_state, "param_groups": [
            {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
             "params": list(range(len(names)))}]}],
        "epoch": 3, "global_step": 1234, "hparams": {"width": width, "lr": 1e-3},
    }


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


# --- the variants ------------------------------------------------------------------------------------
def torch_save_bare(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def torch_save_durable(obj: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def round_order(names: list[str], rnd: int) -> list[str]:
    """Rotate by one each round, and reverse every other cycle of rotations: with 2 variants the orders go
    ab, ba, ba, ab, ...; with 3 they visit all 6 permutations. No variant always runs first or after the same one."""
    shift = rnd % len(names)
    order = names[shift:] + names[:shift]
    return order[::-1] if (rnd // len(names)) % 2 else order


def run_rounds(
    variants: dict[str, Callable[[], Any]], rounds: int, after: Callable[[], None]
) -> dict[str, list[float]]:
    """One untimed warm-up call per variant, then `rounds` interleaved rounds; `after` runs untimed after each."""
    for fn in variants.values():
        fn()
        after()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rnd in range(rounds):
        for name in round_order(list(variants), rnd):
            times[name].append(timed(variants[name]))
            after()
    return times


def measure_save(obj: Any, workdir: Path, rounds: int) -> dict[str, list[float]]:
    path = workdir / "save.ckpt"

    def cleanup() -> None:
        path.unlink(missing_ok=True)
        os.sync()

    return run_rounds({
        "atomic_save (ours)": lambda: atomic_save(obj, path),
        "torch.save + fsync": lambda: torch_save_durable(obj, path),
        "torch.save (bare)": lambda: torch_save_bare(obj, path),
    }, rounds, cleanup)


def measure_load(obj: Any, workdir: Path, rounds: int) -> dict[str, list[float]]:
    path = workdir / "load.ckpt"
    torch.save(obj, path)
    os.sync()
    loaded = safe_load(path)  # sanity: our loader returns exactly what was saved
    assert torch.equal(loaded["state_dict"]["0.weight"], obj["state_dict"]["0.weight"])
    return run_rounds({
        "safe_load (ours)": lambda: safe_load(path),
        "torch.load(weights_only=True)": lambda: torch.load(path, weights_only=True),
    }, rounds, lambda: None)


def _copy_tensors(value: Any) -> None:
    """Clone every tensor of a loaded checkpoint, as loading it into a model and optimizer copies them."""
    if isinstance(value, torch.Tensor):
        value.clone()
    elif isinstance(value, dict):
        for item in value.values():
            _copy_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _copy_tensors(item)


def measure_load_and_copy(workdir: Path, rounds: int) -> dict[str, list[float]]:
    path = workdir / "load.ckpt"  # written by measure_load
    return run_rounds({
        "safe_load + copy (ours)": lambda: _copy_tensors(safe_load(path)),
        "torch.load + copy": lambda: _copy_tensors(torch.load(path, weights_only=True)),
    }, rounds, lambda: None)


def lightning_saver(width: int, workdir: Path) -> Any:
    """A function saving a Lightning checkpoint of the same model after one Adam step (None without Lightning)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        return None
    import logging

    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class LitBig(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(width)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=workdir)
    trainer.fit(LitBig(), DataLoader(TensorDataset(torch.randn(4, width)), batch_size=4))
    return trainer.save_checkpoint


def measure_trainer_save(width: int, workdir: Path, rounds: int,
                         with_lightning: bool = True) -> tuple[dict[str, list[float]], int]:
    """Trainer.save_checkpoint after one Adam step vs torch.save of the model and optimizer state dicts."""
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Trainer, TrainModule

    class Big(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(width)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    model = Big()
    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(4, width)), batch_size=4))
    optimizer = trainer.optimizers[0]
    bare = {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = workdir / "trainer.ckpt"

    def cleanup() -> None:
        path.unlink(missing_ok=True)
        os.sync()

    def plain_state() -> dict[str, Any]:  # building the state dicts is part of any save
        return {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}

    variants = {
        "Trainer.save_checkpoint (ours)": lambda: trainer.save_checkpoint(path),
        "torch.save + fsync": lambda: torch_save_durable(plain_state(), path),
        "torch.save (bare)": lambda: torch_save_bare(plain_state(), path),
    }
    lit_save = lightning_saver(width, workdir) if with_lightning else None
    if lit_save is not None:
        variants["Lightning trainer.save_checkpoint"] = lambda: lit_save(path)
    times = run_rounds(variants, rounds, cleanup)
    trainer.save_checkpoint(path)
    checked = safe_load(path)
    assert torch.equal(checked["state_dict"]["net.0.weight"], model.net[0].weight.detach())
    path.unlink()
    return times, tensor_bytes(bare)


def summarize(times: dict[str, list[float]], baseline: str) -> list[dict[str, Any]]:
    base = times[baseline]
    rows = []
    for name, values in times.items():
        rows.append({
            "variant": name,
            "median_ms": statistics.median(values) * 1e3,
            "min_ms": min(values) * 1e3,
            "max_ms": max(values) * 1e3,
            "runs_ms": [round(v * 1e3, 3) for v in values],
            "baseline": baseline,
            "ratio_of_medians": statistics.median(values) / statistics.median(base),
            "median_paired_ratio": statistics.median(v / b for v, b in zip(values, base, strict=True)),
        })
    return rows


def markdown_table(sections: list[tuple[str, list[dict[str, Any]]]]) -> str:
    lines = ["| operation | variant | median ms | min–max ms | vs baseline |", "|---|---|---:|---:|---:|"]
    for title, rows in sections:
        for r in rows:
            ratio = "baseline" if r["variant"] == r["baseline"] else f"{r['ratio_of_medians']:.2f}x"
            lines.append(f"| {title} | {r['variant']} | {r['median_ms']:.0f} | {r['min_ms']:.0f}–{r['max_ms']:.0f} "
                         f"| {ratio} |")
    return "\n".join(lines)


# name in the result file, and role, of each variant: (section, variant) -> (name, role)
FIGURE_NAMES: dict[tuple[str, str], tuple[str, str]] = {
    ("save", "atomic_save (ours)"): ("save_ours", "ours"),
    ("save", "torch.save + fsync"): ("save_durable", "baseline"),
    ("save", "torch.save (bare)"): ("save_bare", "reference"),
    ("load", "safe_load (ours)"): ("load_ours", "ours"),
    ("load", "torch.load(weights_only=True)"): ("load_torch", "baseline"),
    ("load + copy", "safe_load + copy (ours)"): ("load_copy_ours", "ours"),
    ("load + copy", "torch.load + copy"): ("load_copy_torch", "baseline"),
    ("Trainer save", "Trainer.save_checkpoint (ours)"): ("trainer_save_ours", "ours"),
    ("Trainer save", "torch.save + fsync"): ("trainer_save_durable", "baseline"),
    ("Trainer save", "torch.save (bare)"): ("trainer_save_bare", "reference"),
    ("Trainer save", "Lightning trainer.save_checkpoint"): ("trainer_save_lightning", "lightning"),
    ("save (S3 server)", checkpoint_s3.SAVE_OURS): ("s3_save_ours", "ours"),
    ("save (S3 server)", checkpoint_s3.SAVE_PLAIN): ("s3_save_plain", "baseline"),
    ("load (S3 server)", checkpoint_s3.LOAD_OURS): ("s3_load_ours", "ours"),
    ("load (S3 server)", checkpoint_s3.LOAD_PLAIN): ("s3_load_plain", "baseline"),
}
SAVE_TARGET = 1.10


def figures(sections: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """ms per call for every variant; ratios paired per round against the section's baseline."""
    out = []
    for title, rows in sections:
        base_row = next(r for r in rows if r["variant"] == r["baseline"])
        base_name = FIGURE_NAMES[(title, base_row["variant"])][0]
        for r in rows:
            name, role = FIGURE_NAMES[(title, r["variant"])]
            is_base = r is base_row
            out.append(figure(
                name, f"{title}: {r['variant']}", r["runs_ms"], "ms", role=role,  # type: ignore[arg-type]
                baseline=None if is_base else base_name,
                ratios=None if is_base else paired(r["runs_ms"], base_row["runs_ms"]),
                target=SAVE_TARGET if role == "ours" and "S3" not in title else None,
            ))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12.6 MB, 3 rounds (smoke test, < 60 s)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 11, quick 3)")
    parser.add_argument("--width", type=int, default=None,
                        help="Linear width; 4 layers x 3 copies (weights + 2 Adam moments) "
                             "(default 1448 = 100.7 MB, quick 512 = 12.6 MB)")
    parser.add_argument("--no-trainer", action="store_true", help="skip the Trainer.save_checkpoint comparison")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--no-s3", action="store_true", help="skip the rows on a local S3 server (moto)")
    parser.add_argument("--s3-rounds", type=int, default=None,
                        help="measured rounds of the S3 rows (default: --rounds; each 100 MB save takes ~4 s there)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the scratch folder is made (default: the folder of --out, i.e. "
                             f"{RESULTS} unless --out says otherwise)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    width = args.width or (512 if args.quick else 1448)
    rounds = args.rounds or (3 if args.quick else 11)
    obj = make_checkpoint(width)
    size = tensor_bytes(obj)

    args.dir = args.dir or args.out.parent
    args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="checkpoint-bench-", dir=args.dir))
    started = time.perf_counter()
    try:
        save = summarize(measure_save(obj, workdir, rounds), "torch.save + fsync")
        load = summarize(measure_load(obj, workdir, rounds), "torch.load(weights_only=True)")
        load_copy = summarize(measure_load_and_copy(workdir, rounds), "torch.load + copy")
        sections = [("save", save), ("load", load), ("load + copy", load_copy)]
        trainer_rows, trainer_bytes = None, None
        if not args.no_trainer:
            times, trainer_bytes = measure_trainer_save(width, workdir, rounds, not args.no_lightning)
            trainer_rows = summarize(times, "torch.save + fsync")
            sections.append(("Trainer save", trainer_rows))
        s3_skipped = "--no-s3" if args.no_s3 else checkpoint_s3.available()
        if s3_skipped is None:
            s3_saves, s3_loads = checkpoint_s3.measure(obj, args.s3_rounds or rounds, run_rounds)
            sections += [("save (S3 server)", summarize(s3_saves, checkpoint_s3.SAVE_PLAIN)),
                         ("load (S3 server)", summarize(s3_loads, checkpoint_s3.LOAD_PLAIN))]
        probe = workdir / "size.ckpt"
        torch.save(obj, probe)
        file_bytes = probe.stat().st_size
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - started

    table = markdown_table(sections)
    by_name = {r["variant"]: r for r in save + load + load_copy}
    headline = {
        "save_ours_vs_durable": by_name["atomic_save (ours)"]["ratio_of_medians"],
        "save_ours_vs_bare": by_name["atomic_save (ours)"]["median_ms"] / by_name["torch.save (bare)"]["median_ms"],
        "durable_vs_bare": by_name["torch.save + fsync"]["median_ms"] / by_name["torch.save (bare)"]["median_ms"],
        "load_ours_vs_torch_load": by_name["safe_load (ours)"]["ratio_of_medians"],
        "load_copy_ours_vs_torch": by_name["safe_load + copy (ours)"]["ratio_of_medians"],
        "save_target": SAVE_TARGET,
    }
    headline["save_target_met"] = headline["save_ours_vs_durable"] <= headline["save_target"]
    headline["load_target_met"] = max(headline["load_ours_vs_torch_load"],
                                      headline["load_copy_ours_vs_torch"]) <= headline["save_target"]
    s3_rows = {r["variant"]: r for title, rows in sections if "S3" in title for r in rows}
    if s3_rows:
        headline["s3_save_ours_vs_plain"] = s3_rows[checkpoint_s3.SAVE_OURS]["ratio_of_medians"]
        headline["s3_load_ours_vs_plain"] = s3_rows[checkpoint_s3.LOAD_OURS]["ratio_of_medians"]
    print(f"\n{size / 1e6:.1f} MB of tensors ({file_bytes / 1e6:.1f} MB file), {rounds} interleaved rounds, "
          f"torch {torch.__version__}, {os.cpu_count()} logical CPUs, scratch dir under {args.dir}\n")
    print(table)
    print(f"\nsave: ours / durable baseline = {headline['save_ours_vs_durable']:.2f}x (target <= 1.10x: "
          f"{'met' if headline['save_target_met'] else 'NOT met'}); ours / bare torch.save = "
          f"{headline['save_ours_vs_bare']:.2f}x; durable / bare = {headline['durable_vs_bare']:.2f}x")
    print(f"load (CRC-checked): ours / torch.load = {headline['load_ours_vs_torch_load']:.2f}x; load + copy: "
          f"{headline['load_copy_ours_vs_torch']:.2f}x (target <= 1.10x: "
          f"{'met' if headline['load_target_met'] else 'NOT met'})")
    if s3_rows:
        print(f"S3 server: save ours / plain fsspec write = {headline['s3_save_ours_vs_plain']:.2f}x; "
              f"load ours / plain fsspec read = {headline['s3_load_ours_vs_plain']:.2f}x")
    else:
        print(f"S3 rows skipped: {s3_skipped}")
    print(f"benchmark took {elapsed:.1f} s")

    write_result(
        args.out, "checkpoint", figures(sections), mode="quick" if args.quick else "full",
        config={"width": width, "layers": 4, "rounds": rounds, "quick": args.quick, "tensor_bytes": size,
                "file_bytes": file_bytes, "trainer_tensor_bytes": trainer_bytes, "s3_skipped": s3_skipped,
                "s3_rounds": args.s3_rounds or rounds},
        elapsed_s=elapsed, machine=machine_info(lightning=lightning_version()),
        headline=headline, save=save, load=load, trainer_save=trainer_rows, table=table,
    )


if __name__ == "__main__":
    main()
