"""The batched LoRA update (astrai.model.lora_batch) against a naive loop: each token gets
exactly its own adapter's update; rows of the base and of other adapters are never
touched by an adapter's values, whatever they are (a NaN adapter beside them leaves base
rows bit for bit as the base computed them); the bank holds what is resident, no more."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai.model import lora_batch
from astrai.model.lora_batch import LoraBank

IN, OUT = 12, 10


def adapter(rank: int, seed: int, fill: float | None = None) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rank, IN, generator=g), torch.randn(OUT, rank, generator=g)
    if fill is not None:
        a[0, 0] = fill
        b[1, 0] = fill
    return a, b


def naive(x, base, slots, held):
    """Row by row: base(x) plus s · B A x of the row's adapter (none for -1)."""
    rows = []
    for i, s in enumerate(slots):
        y = base(x[i])
        if s >= 0:
            a, b, scale = held[s]
            y = y + scale * (b @ (a @ x[i]))
        rows.append(y)
    return torch.stack(rows)


def run(bank, layer, x, slots, dtype=torch.float32):
    layer = layer.to(dtype)
    sel = bank.selection(slots)
    with torch.no_grad():
        y = layer(x.to(dtype))
        return y if sel is None else lora_batch.apply(sel, x.to(dtype), layer, y)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("slots", [
    [-1, 0, 0, 1, -1, 1, 0],   # interleaved: rows gathered by index
    [-1, -1, 0, 0, 1, 1, 1],   # consecutive: rows as slices
    [0, 0, 0, 0, 0, 0, 0],     # every row one adapter
])
def test_a_non_finite_adapter_reaches_only_its_own_rows(bad, slots):
    torch.manual_seed(0)
    layer = nn.Linear(IN, OUT)
    bank = LoraBank({"m": layer}, torch.device("cpu"))
    held = {0: (*adapter(3, 1, fill=bad), 0.5), 1: (*adapter(5, 2), 2.0)}
    for s, (a, b, scale) in held.items():
        bank.write(s, scale, {"m": (a, b)})
    x = torch.randn(len(slots), IN)
    got = run(bank, layer, x, slots)
    want = naive(x, layer, slots, held)
    with torch.no_grad():
        base = layer(x)  # the same product with no adapter selected
    for i, s in enumerate(slots):
        if s == -1:  # the base's own row, bit for bit
            assert torch.equal(got[i], base[i])
        elif s == 1:
            torch.testing.assert_close(got[i], want[i], rtol=1e-5, atol=1e-5)
        else:
            assert not torch.isfinite(got[i]).all()


def test_a_bf16_base_gets_the_update_in_its_dtype():
    torch.manual_seed(0)
    layer = nn.Linear(IN, OUT)
    bank = LoraBank({"m": layer}, torch.device("cpu"))
    held = {1: (*adapter(4, 3), 1.5)}
    bank.write(1, 1.5, {"m": held[1][:2]})
    slots = [1, -1, 1]
    x = torch.randn(3, IN)
    got = run(bank, layer, x, slots, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(got[1], layer.to(torch.bfloat16)(x.bfloat16())[1])
    torch.testing.assert_close(got.float(), naive(x, layer.float(), slots, held),
                               rtol=0.05, atol=0.1)


def test_the_bank_holds_only_what_is_resident():
    layers = {"p": nn.Linear(IN, OUT), "q": nn.Linear(IN, OUT)}
    bank = LoraBank(layers, torch.device("cpu"))
    small = {"p": adapter(2, 1)}
    big = {"p": adapter(64, 2), "q": adapter(64, 3)}
    bank.write(0, 1.0, small)
    alone = bank.nbytes()
    assert alone == 2 * (IN + OUT) * 4
    bank.write(1, 1.0, big)
    assert bank.nbytes() == alone + 2 * 64 * (IN + OUT) * 4
    bank.clear(1)  # the big one leaves: the bank is the small one's size again
    assert bank.nbytes() == alone
    x = torch.randn(2, IN)
    got = run(bank, layers["p"], x, [0, 0])
    torch.testing.assert_close(got, naive(x, layers["p"], [0, 0], {0: (*small["p"], 1.0)}))


def test_a_failed_write_leaves_the_slot_empty():
    layer = nn.Linear(IN, OUT)
    bank = LoraBank({"m": layer}, torch.device("cpu"))
    bank.write(0, 1.0, {"m": adapter(2, 1)})
    with pytest.raises(KeyError):
        bank.write(0, 1.0, {"m": adapter(2, 2), "missing": adapter(2, 3)})
    assert bank.nbytes() == 0
    x = torch.randn(2, IN)
    with torch.no_grad():
        assert torch.equal(run(bank, layer, x, [0, 0]), layer(x))
