"""Plans over several cards of adapters and 16-bit steps: what each rank holds (`per_rank`)."""

import pytest

from torchfit.memory.plan import plan_card


def test_lora_over_several_cards_shards_the_adapters_state_only():
    """A LoRA or QLoRA step under DDP/ZeRO: the adapters' gradients and optimizer state are
    what ZeRO shards (this crashed on trainable_params=1 until the adapters were counted)."""
    kw = {"dtype": "nf4", "lora_rank": 8, "batch_size": 1, "seq_len": 64}
    single = plan_card("llama-3.2-1b", "H100", **kw).estimate
    zero2 = plan_card("llama-3.2-1b", ["H100"] * 2, strategy="zero2", **kw).estimate
    assert zero2.optimizer == single.optimizer // 2 > 0  # the adapters' Adam state, halved
    assert zero2.weights == single.weights  # the frozen base is replicated
    ddp = plan_card("llama-3.2-1b", ["H100"] * 2, strategy="ddp", **kw).estimate
    assert ddp.optimizer == single.optimizer
    fsdp = plan_card("llama-3.2-1b", ["H100"] * 2, strategy="fsdp", **kw).estimate
    assert fsdp.optimizer == zero2.optimizer  # the adapters' state sharded the same way
    # in backward two units' gradients are in flight: a block's adapters, not its weights
    assert fsdp.gradients <= single.gradients


def test_ranks_gather_and_bucket_parameters_in_the_dtype_the_step_holds_them():
    """bf16-true holds 2-byte parameters and gradients: FSDP gathers and DDP's buckets copy
    half the bytes they do under bf16-mixed's fp32 master weights."""
    kw = {"batch_size": 1, "seq_len": 64}
    mixed = plan_card("llama-3.2-1b", ["H100"] * 4, strategy="ddp", precision="bf16-mixed", **kw)
    true = plan_card("llama-3.2-1b", ["H100"] * 4, strategy="ddp", precision="bf16-true", **kw)
    assert true.estimate.gradients * 2 == mixed.estimate.gradients
    fsdp = {"strategy": "fsdp", **kw}
    mixed = plan_card("llama-3.2-1b", ["H100"] * 4, precision="bf16-mixed", **fsdp).estimate
    true = plan_card("llama-3.2-1b", ["H100"] * 4, precision="bf16-true", **fsdp).estimate
    assert true.weights * 2 == pytest.approx(mixed.weights, rel=1e-6)  # shards + 2 units


def test_fsdp_gathers_the_root_once_and_each_unit_as_it_is_stored():
    """FSDP keeps the root (embeddings, head) gathered and two blocks beside it: a QLoRA
    block is gathered as its 4-bit codes, the prepared root in fp32, once (it was counted
    as two of the largest unit, both in fp32: twice the 1B's 128K embedding)."""
    from torchfit.memory.analytic.quantized import block_linear_shapes, linear_bytes
    from torchfit.memory.plan.settings import transformer_spec
    from torchfit.memory.plan.sharded import gathered_bytes
    from torchfit.memory.step import Step

    spec = transformer_spec("llama-3.2-1b")
    kw = {"dtype": "nf4", "lora_rank": 16, "batch_size": 1, "seq_len": 64}
    single = plan_card("llama-3.2-1b", "H100", **kw).estimate
    step = Step(quantization="nf4", lora_rank=16, precision="bf16-mixed", seq_len=64)
    root, unit = gathered_bytes(spec, step, single.weights, None)
    assert root == 4 * spec.embedding_params  # tied: the prepared embedding, fp32
    codes = linear_bytes(block_linear_shapes(spec), step.numerics.weights) // spec.num_layers
    assert codes < unit < codes * 1.3  # the 4-bit codes, plus fp32 adapters and norms
    fsdp = plan_card("llama-3.2-1b", ["H100"] * 2, strategy="fsdp", **kw).estimate
    assert fsdp.weights == pytest.approx(single.weights / 2 + root + 2 * unit, abs=2)
    # 16-bit gathers: the root in bf16, a block's codes as they are
    bf16 = gathered_bytes(spec, step, single.weights, "bf16")
    assert bf16 == (2 * spec.embedding_params, unit)
