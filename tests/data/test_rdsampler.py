"""RDSampler: seeded shuffle, rank sharding, exact mid-epoch resume."""

import pytest
import torch
from torch.utils.data import DataLoader

from astrai.data.rdsampler import RDSampler
from astrai.errors import CheckpointError, ConfigError


def run(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def test_epoch_is_a_seeded_permutation_and_changes_per_epoch():
    s = RDSampler(50, seed=3)
    e0 = list(s)
    e1 = list(s)  # the epoch advances after a full pass
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1
    assert list(RDSampler(50, seed=3)) == e0
    assert list(RDSampler(50, seed=4)) != e0
    assert list(RDSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_gives_the_uninterrupted_order(world_size):
    n, steps = 23, 5
    full = {r: [] for r in range(world_size)}
    for r in range(world_size):
        s = RDSampler(n, seed=7, rank=r, world_size=world_size)
        full[r] = list(s) + list(s)  # two epochs
    for r in range(world_size):
        s = RDSampler(n, seed=7, rank=r, world_size=world_size)
        head = run(s, steps)
        state = s.state_dict()
        resumed = RDSampler(n, seed=7, rank=r, world_size=world_size)
        resumed.load_state_dict(state)
        resumed.set_epoch(0)  # a trainer calls set_epoch: it must not rewind
        tail = list(resumed) + list(resumed)
        assert head + tail == full[r]


def test_ranks_partition_the_epoch():
    ranks = [list(RDSampler(10, seed=1, rank=r, world_size=3)) for r in range(3)]
    assert all(len(x) == 4 for x in ranks)  # padded to 12 by wrapping around
    seen = sorted(i for x in ranks for i in x)
    assert set(seen) == set(range(10)) and len(seen) == 12
    dropped = [list(RDSampler(10, seed=1, rank=r, world_size=3, drop_last=True))
               for r in range(3)]
    flat = [i for x in dropped for i in x]
    assert len(flat) == len(set(flat)) == 9


def test_resume_through_a_dataloader_with_consumed_count():
    data = list(range(40))
    s = RDSampler(40, seed=0)
    dl = DataLoader(data, batch_size=4, sampler=s)
    it = iter(dl)
    seen = [next(it) for _ in range(3)]
    state = s.state_dict(consumed=12)  # what the trainer really used
    s2 = RDSampler(40, seed=0)
    s2.load_state_dict(state)
    rest = list(DataLoader(data, batch_size=4, sampler=s2))
    got = torch.cat(seen + rest).tolist()
    assert got == list(RDSampler(40, seed=0))


def test_world_size_change_resumes_without_loss():
    s = RDSampler(20, seed=2, rank=0, world_size=2)
    run(s, 3)  # 6 global samples consumed
    order = s.epoch_order(0)
    new = [RDSampler(20, seed=2, rank=r, world_size=3) for r in range(3)]
    for x in new:
        x.load_state_dict(s.state_dict())
    rest = [i for x in new for i in x]
    # nothing left out; at most world_size - 1 wrap-around repeats pad the last step
    assert set(order[6:].tolist()) <= set(rest)
    assert 0 <= len(rest) - len(order[6:]) < 3


def test_bad_arguments_and_mismatched_state():
    with pytest.raises(ConfigError):
        RDSampler(0)
    with pytest.raises(ConfigError):
        RDSampler(10, rank=2, world_size=2)
    s = RDSampler(10, seed=1)
    with pytest.raises(CheckpointError, match="seed"):
        RDSampler(10, seed=2).load_state_dict(s.state_dict())
    with pytest.raises(CheckpointError, match="length"):
        RDSampler(11, seed=1).load_state_dict(s.state_dict())
