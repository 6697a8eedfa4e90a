"""`max_batch_size` with a callable: the OOM line must fit the budget as well."""

import pytest

from torchfit.memory import MemoryEstimate
from torchfit.memory.batch import Margin, max_batch_size

MiB, GiB = 2**20, 2**30


def _predictor(line_per_sample):
    """1 GiB of weights and 100 MiB a sample; the OOM line ``line_per_sample`` above that."""

    def predict(batch):
        total = GiB + batch * 100 * MiB
        return MemoryEstimate(
            weights=GiB, activations=batch * 100 * MiB, oom_line=total + batch * line_per_sample
        )

    return predict


def test_a_size_whose_oom_line_is_over_the_budget_is_not_picked():
    # allocated: 1 GiB + 100 MiB x b under 93% of 10 GiB -> b <= 84; the allocator's OOM
    # line (120 MiB a sample) under 98% of it -> b <= 75 (a BERT fp16 step on a 10 GiB cap
    # ran out of memory at 91.7% allocated, its replayed line at 10.6 GiB)
    assert max_batch_size(_predictor(0), 10 * GiB, margin=0.07) == 84
    assert max_batch_size(_predictor(20 * MiB), 10 * GiB, margin=0.07) == 75
    sizes = list(range(8, 129, 8))
    assert max_batch_size(_predictor(20 * MiB), 10 * GiB, margin=0.07, batch_sizes=sizes) == 72


def test_the_oom_line_keeps_the_smaller_of_its_share_and_the_margin():
    assert Margin(fraction=0.07).oom_line_fraction == pytest.approx(0.02)
    assert Margin(fraction=0.01).oom_line_fraction == pytest.approx(0.01)
    # with a 1% margin the OOM line may take 99% of the budget: 1 GiB + 130 MiB x b <=
    # 9.9 GiB -> b <= 70 (69 at 98%)
    assert max_batch_size(_predictor(30 * MiB), 10 * GiB, margin=0.01) == 70
