"""One budget rule: every reader of "a card or a size" gets the same bytes and the same error."""

import pytest

from torchfit.memory import plan
from torchfit.memory.batch import max_batch_size, simulate_gpu
from torchfit.memory.batch.predict import BudgetKind, find_budget
from torchfit.memory.device_map.planner import _cards
from torchfit.memory.gpus import GPU, gpu
from torchfit.memory.gpus.budget import budget_of, card_of, read_budget, resolve_budget
from torchfit.memory.result import AffineEstimate, MemoryEstimate

# Bare model numbers ("3060") are names and sizes at once: the rule must decide the same
# way everywhere. The others are plainly one or the other.
VALUES = ["3060", "RTX 3060", " T4 ", "12GiB", "12GB", "12884901888", 8 * 2**30, 1.5e9]


def _bytes(found):
    return found.total if isinstance(found, GPU) else found


@pytest.mark.parametrize("value", [*VALUES, GPU.custom("lab", memory="20GiB")], ids=repr)
def test_every_budget_reader_agrees(value):
    found = read_budget(value)
    nbytes = _bytes(found)
    assert budget_of(value)[0] == nbytes
    assert card_of(value).total == nbytes
    assert plan.resolve_budget(value) == (card_of(value), 1)
    assert resolve_budget([value, "RTX 4090"]) == (card_of(value), 2)
    assert _cards([value]) == [card_of(value)]
    batch = find_budget(value)
    assert batch.bytes == nbytes
    assert (batch.kind is BudgetKind.GPU) is isinstance(found, GPU)
    assert batch.card == (found if isinstance(found, GPU) else None)
    assert simulate_gpu(value).capacity == nbytes


def test_a_model_number_is_the_card_everywhere():
    card = gpu("RTX 3060")
    assert read_budget("3060") == card
    assert budget_of("3060") == (card.memory, card.name)
    assert find_budget("3060").kind is BudgetKind.GPU


@pytest.mark.parametrize("value", ["RTX 9999 Ultra", "twelve gigs"])
def test_an_unknown_budget_gets_one_message_everywhere(value):
    with pytest.raises(ValueError) as core:
        read_budget(value)
    message = str(core.value)
    assert f"unknown GPU {value!r}" in message  # the catalog's close matches
    assert "GPU.custom" in message
    assert "neither a size such as '12GB' nor a GPU name" in message
    line = AffineEstimate(MemoryEstimate(weights=10), MemoryEstimate(activations=1))
    for reader in (budget_of, card_of, plan.resolve_budget, simulate_gpu):
        with pytest.raises(ValueError) as other:
            reader(value)
        # the same words; a reader that names its parameter puts it first
        assert str(other.value).endswith(message), reader
    with pytest.raises(ValueError) as batch:
        max_batch_size(line, value)
    assert str(batch.value) == message
    with pytest.raises(ValueError) as device_map:
        _cards([value])
    assert str(device_map.value) == f"gpus[0]: {message}"


@pytest.mark.parametrize("value", [True, None, object()])
def test_other_types_are_refused(value):
    with pytest.raises(TypeError, match="budget is a card name"):
        read_budget(value)
