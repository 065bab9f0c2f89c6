"""The files of a ModelCheckpoint: their names (Lightning's template rules and class constants), the version a name
gets when its file exists, the collective write, the `last` link, and which old file may be removed.

`CheckpointFiles` is ModelCheckpoint's base: what to save and when lives in callbacks/checkpoint.py, how a save
reaches the folder lives here. Every method that takes the trainer is collective unless it says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from callbacks.base import Checkpoint
from callbacks.checkpoint_names import fill_template
from strategies.checkpoint_io.catalog import find_checkpoints, link_checkpoint
from strategies.checkpoint_io.filesystem import AnyPath, is_remote, join, list_names, open_file, to_path
from strategies.checkpoint_io.names import claim_name, release_claim
from strategies.comm.distributed import rank_zero_warn

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class CheckpointFiles(Checkpoint):
    """Names, versions, writes and removes checkpoint files in `dirpath` (the base of ModelCheckpoint)."""

    CHECKPOINT_JOIN_CHAR = "-"
    """Joins the parts of a name: `epoch=1-step=8`, the `-v1` version, a prefix."""
    CHECKPOINT_EQUALS_CHAR = "="
    """Between a field's name and its value when `auto_insert_metric_name`."""
    CHECKPOINT_NAME_LAST = "last"
    """The template of the `save_last` file (may hold fields: `"{epoch}-last"`)."""
    FILE_EXTENSION = ".ckpt"
    """The extension of every file this callback writes (and finds for `ckpt_path="last"`)."""
    STARTING_VERSION = 1
    """The first version number the version counter tries (`name-v1.ckpt`)."""

    dirpath: str | None
    filename: str | None
    auto_insert_metric_name: bool
    enable_version_counter: bool
    save_weights_only: bool
    save_top_k: int
    best_k_models: dict[str, Tensor]
    _last_global_step_saved: int
    _last_checkpoint_saved: str

    def _has_files(self) -> bool:
        assert self.dirpath is not None
        try:
            return bool(list_names(to_path(self.dirpath)))
        except OSError:  # unreadable: the first save reports it, on every rank
            return False
    def existing_checkpoints(self, trainer: Trainer) -> list[tuple[int, AnyPath]]:
        """(modification time in ns, path) of the checkpoints this callback could resume from (ckpt_path='last');
        on a remote store, committed ones only."""
        if self.dirpath is None:
            self.setup(trainer, trainer.lightning_module, "fit")
        assert self.dirpath is not None
        return find_checkpoints(to_path(self.dirpath), f"*{self.FILE_EXTENSION}")
    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None,
                               prefix: str | None = None) -> str:
        """The path for `metrics` (epoch, step and logged values) under `dirpath`: the template `filename` (default:
        this callback's, else '{epoch}-{step}') filled, then `prefix-` before and `-v<ver>` after it, then
        `FILE_EXTENSION`. A field whose metric is missing reads 0.

        Example:
            `ModelCheckpoint(dirpath="ckpts", filename="{epoch}-{val_loss:.2f}").format_checkpoint_name({"epoch": 2,
            "val_loss": 0.123})` is `".../ckpts/epoch=2-val_loss=0.12.ckpt"`.
        """
        template = filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        name = fill_template(template, metrics, self.auto_insert_metric_name, self.CHECKPOINT_EQUALS_CHAR)
        if prefix is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([prefix, name])
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([name, f"v{ver}"])
        name += self.FILE_EXTENSION
        return str(join(to_path(self.dirpath), name)) if self.dirpath else name

    def to_yaml(self, filepath: str | Path | None = None) -> None:
        """Write `best_k_models` (path: score) as YAML to `filepath` (default `<dirpath>/best_k_models.yaml`)."""
        import yaml  # omegaconf's dependency, so always installed; imported here to keep `import callbacks` light

        if filepath is None:
            assert self.dirpath is not None, "ModelCheckpoint.to_yaml() without a filepath needs dirpath (set at setup)"
            filepath = str(join(to_path(self.dirpath), "best_k_models.yaml"))
        with open_file(to_path(filepath), "w") as handle:
            yaml.safe_dump({path: score.item() for path, score in self.best_k_models.items()}, handle)

    def file_exists(self, filepath: str | Path, trainer: Trainer) -> bool:
        """Collective: whether `filepath` exists, as rank 0 sees it (every rank gets the same answer)."""
        from strategies.checkpoint_io.filesystem import exists

        here = exists(to_path(filepath)) if trainer.is_global_zero else False
        return trainer.strategy.reduce_boolean_decision(here, all=False)
    # --- writing (collective) ---------------------------------------------------------------------------------
    def _claim(self, trainer: Trainer, candidates: dict[str, Tensor], previous: str = "",
               template: str | None = None) -> str:
        """Collective. The path for `candidates`, or when a file of that name exists (or another run is writing it),
        its next free version (`-v1`, `-v2`, ... by `CHECKPOINT_JOIN_CHAR` and `STARTING_VERSION`), claimed by rank
        0 (strategies/checkpoint_io/names.py), as Lightning's `enable_version_counter` does. `previous` (the file this
        save replaces, e.g. a resumed run's `last-v1.ckpt`) is re-saved in place when the versions reach it."""
        path = self.format_checkpoint_name(candidates, template)
        if path == previous or not self.enable_version_counter:
            return path
        chosen = path
        if trainer.is_global_zero:
            def version(n: int) -> AnyPath:
                return to_path(self.format_checkpoint_name(candidates, template, ver=n))

            try:
                chosen = str(claim_name(to_path(path), {previous} if previous else (), version, self.STARTING_VERSION))
            except Exception:  # noqa: BLE001 - e.g. a read-only folder: the save itself then fails on every rank
                chosen = path  # with a CheckpointSaveError; raising here would leave the others in the broadcast
        chosen = trainer.strategy.broadcast(chosen)
        if chosen != path:
            rank_zero_warn(f"ModelCheckpoint: {path} exists (written by another run, or earlier in this one); this "
                           f"run saves {chosen} instead of overwriting it (enable_version_counter=False overwrites).")
        return chosen

    def _link_checkpoint(self, trainer: Trainer, target: str, link: str) -> None:
        """Point `link` (claimed; `last.ckpt`) at `target` with a relative symlink, once no save is in flight."""
        trainer.strategy.wait_for_saves()  # never link to a checkpoint still being written
        if trainer.is_global_zero:
            if Path(target).absolute() != Path(link).absolute():
                link_checkpoint(Path(target), Path(link))
            release_claim(to_path(link))
        trainer.strategy.barrier("ModelCheckpoint last link")

    def _save_checkpoint(self, trainer: Trainer, path: str) -> None:
        """Save to `path` (claimed), release the claim, and tell the loggers (e.g. to upload it as an artifact)."""
        try:
            trainer.save_checkpoint(path, self.save_weights_only)
        finally:
            if trainer.is_global_zero:
                release_claim(to_path(path))
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = path
        for logger in trainer.loggers:  # rank 0 only, by the Logger base class
            logger.after_save_checkpoint(self)

    def _should_remove_checkpoint(self, trainer: Trainer, previous: str, current: str) -> bool:
        """Lightning's rule: never the file just written, nor (locally) the checkpoint this run resumed from, nor a
        file outside `dirpath`."""
        if previous == current:
            return False
        if is_remote(previous):
            return True
        old = Path(previous).absolute()
        if trainer.ckpt_path is not None and Path(trainer.ckpt_path).absolute() == old:
            return False
        assert self.dirpath is not None
        return Path(self.dirpath).absolute() in old.parents
    def _remove_checkpoint(self, trainer: Trainer, path: str) -> None:
        # a file or a sharded folder, local or on a store; after the save in flight commits, if one is
        trainer.strategy.remove_checkpoint(to_path(path))
