"""Sampler injection rules, limits and batch iteration, tested without starting any process."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler

from tests.helpers.boring import RandomDataset
from trainer.data import lengths
from trainer.data import loaders as data
from trainer.data.sampling import ResumableSampler, prepare_loader
from trainer.exceptions import ConfigError, MisconfigurationError

KW = {"num_replicas": 2, "rank": 1}


def test_training_loader_gets_a_distributed_sampler_keeping_shuffle_and_drop_last():
    loader = DataLoader(RandomDataset(32, 10), batch_size=3, shuffle=True, drop_last=True)
    new = prepare_loader(loader, KW, training=True)
    assert isinstance(new.sampler, ResumableSampler) and isinstance(new.sampler.inner, DistributedSampler)
    assert new.sampler.inner.shuffle and new.drop_last
    assert (new.sampler.inner.num_replicas, new.sampler.inner.rank, new.batch_size) == (2, 1, 3)
    assert len(new) == 1  # 5 samples on this rank, batches of 3, last one dropped


def test_evaluation_loader_is_sharded_without_padding():
    loader = DataLoader(RandomDataset(32, 7), batch_size=2)
    shards = [list(prepare_loader(loader, {"num_replicas": 2, "rank": r}, training=False).sampler)
              for r in range(2)]
    assert shards == [[0, 2, 4, 6], [1, 3, 5]]


def test_no_sharding_when_the_strategy_does_not_ask():
    loader = DataLoader(RandomDataset(32, 7), batch_size=2)
    assert prepare_loader(loader, None, training=False) is loader
    train = prepare_loader(loader, None, training=True)
    assert isinstance(train.sampler, ResumableSampler) and isinstance(train.sampler.inner, SequentialSampler)


@pytest.mark.parametrize("generator", [None, torch.Generator().manual_seed(3)], ids=["global_rng", "generator"])
def test_resumable_sampler_replays_an_epoch_from_a_position(generator):  # noqa: ANN001
    loader = prepare_loader(DataLoader(range(10), batch_size=2, shuffle=True, generator=generator), None,
                            training=True)
    loader.sampler.begin_epoch()
    first = [int(i) for batch in loader for i in batch]
    state = loader.sampler.epoch_state
    loader.sampler.begin_epoch(state, skip=4)
    assert [int(i) for batch in loader for i in batch] == first[4:]
    assert sorted(first) == list(range(10))


def test_a_generator_shuffled_loader_keeps_the_order_plain_iteration_gives():
    def make() -> DataLoader:
        return DataLoader(range(12), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))

    plain, wrapped = make(), prepare_loader(make(), None, training=True)
    for _ in range(3):
        wrapped.sampler.begin_epoch()
        assert [b.tolist() for b in wrapped] == [b.tolist() for b in plain]


def test_a_batch_sampler_the_user_built_is_kept():
    dataset = list(range(8))
    loader = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 4, drop_last=False))
    assert prepare_loader(loader, None, training=True) is loader


class MyLoader(DataLoader):
    """A subclass with an argument of its own, kept as an attribute (what Lightning needs to re-create it)."""

    def __init__(self, dataset, tag: str, **kwargs) -> None:  # noqa: ANN001
        super().__init__(dataset, **kwargs)
        self.tag = tag


class Opaque(DataLoader):
    def __init__(self, dataset, secret: int, **kwargs) -> None:  # noqa: ANN001
        super().__init__(dataset, **kwargs)


class Reversed(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # noqa: ANN204
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def _ranks(make, training: bool) -> list[list[int]]:  # noqa: ANN001
    out = []
    for rank in (0, 1):
        loader = prepare_loader(make(), {"num_replicas": 2, "rank": rank}, training=training)
        if training:
            loader.sampler.begin_epoch()
        out.append([i for b in loader for i in b.tolist()])
    return out


def test_a_custom_sampler_is_sharded_in_its_own_order():
    make = lambda: DataLoader(list(range(7)), batch_size=2, sampler=Reversed(7))  # noqa: E731
    assert _ranks(make, training=True) == [[6, 4, 2, 0], [5, 3, 1, 6]]  # padded from the start, as Lightning does
    assert _ranks(make, training=False) == [[6, 4, 2, 0], [5, 3, 1]]  # every sample once


def test_a_dataloader_subclass_is_recreated_with_its_own_arguments():
    loader = prepare_loader(MyLoader(list(range(8)), tag="x", batch_size=2, shuffle=True), KW, training=True)
    assert type(loader) is MyLoader and loader.tag == "x" and loader.batch_size == 2
    assert isinstance(loader.sampler.inner, DistributedSampler) and loader.sampler.inner.shuffle


def test_a_subclass_that_cannot_be_recreated_says_how_to_fix_it():
    with pytest.raises(MisconfigurationError, match=r"takes 'secret'.*self.secret = secret.*use_distributed_sampler"):
        prepare_loader(Opaque(list(range(8)), secret=3, batch_size=2), KW, training=True)


def test_a_custom_batch_sampler_is_recreated_around_the_shard():
    class Pairs(BatchSampler):
        pass

    loader = DataLoader(list(range(8)), batch_sampler=Pairs(SequentialSampler(range(8)), 2, drop_last=False))
    rebuilt = prepare_loader(loader, {"num_replicas": 2, "rank": 1}, training=False)
    assert type(rebuilt.batch_sampler) is Pairs
    assert [b.tolist() for b in rebuilt] == [[1, 3], [5, 7]]


def test_limits_and_lengths():
    assert lengths.limit_batches("train", 10, 0.25) == 2
    assert lengths.limit_batches("train", 10, 3) == 3
    assert lengths.limit_batches("train", math.inf, 1.0) == math.inf
    with pytest.raises(ConfigError, match=r"limit_val_batches=0.5 is a fraction, but the val loader has no length"):
        lengths.limit_batches("val", math.inf, 0.5)


def test_iterate_marks_the_last_batch_with_and_without_a_length():
    assert [(i, last) for i, _, last in data.iterate(range(4), 4)] == [(0, False), (1, False), (2, False), (3, True)]
    assert [(i, last) for i, _, last in data.iterate(iter(range(3)), math.inf)] == [(0, False), (1, False), (2, True)]
    assert [i for i, _, _ in data.iterate(range(10), 2)] == [0, 1]


def test_a_list_of_numbers_is_one_iterable_of_a_combined_loader():
    from trainer.data.combined_loader import CombinedLoader

    combined = CombinedLoader({"a": [0, 1, 2], "b": [3, 4]}, "min_size")
    iter(combined)
    assert [batch for batch, _, _ in combined] == [{"a": 0, "b": 3}, {"a": 1, "b": 4}]


def test_set_epoch_reaches_each_sampler_once_also_in_evaluation():
    from unittest.mock import Mock

    from tests.helpers.boring import QUIET, BoringModel
    from trainer import Trainer

    def loader() -> DataLoader:
        sampler = RandomSampler(RandomDataset(32, 8))
        sampler.set_epoch = Mock()  # type: ignore[attr-defined]
        return DataLoader(sampler.data_source, sampler=sampler, batch_size=4)

    train, val = loader(), loader()
    Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=1, **QUIET).fit(BoringModel(), train, val)
    assert [c.args for c in train.sampler.set_epoch.mock_calls] == [(0,), (1,)]
    assert [c.args for c in val.sampler.set_epoch.mock_calls] == [(0,), (0,), (1,)]  # the sanity check, 2 epochs


def test_a_len_that_raises_not_implemented_means_no_length():
    class NoLength(DataLoader):
        def __len__(self) -> int:
            raise NotImplementedError

    assert lengths.loader_length(NoLength(RandomDataset(32, 8), batch_size=4)) == math.inf
