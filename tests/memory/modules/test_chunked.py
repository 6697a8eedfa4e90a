"""A loss in chunks of positions, for any causal LM: the meta pass and the closed forms.

The real step is LitGPT's and torchtune's: the model returns the list of logit chunks
(the head run on one slice of positions at a time) and the loss takes a cross-entropy per
chunk, in fp32. It is measured on CPU with `measure_step` and compared with `estimate`.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional

from torchfit.memory import estimate, measure_step
from torchfit.memory.analytic.states import chunked_loss_peak
from torchfit.memory.modules.adapters import role_targets
from torchfit.memory.modules.chunked import chunk_refusal

transformers = pytest.importorskip("transformers")
VOCAB, SEQ, CHUNK = 8000, 256, 32


class ChunkedHead(torch.nn.Module):
    """A causal LM as LitGPT runs it with ``lm_head_chunk_size``: a list of logit chunks."""

    def __init__(self, lm, backbone: str, chunk: int) -> None:
        super().__init__()
        self.lm, self.backbone, self.chunk = lm, backbone, chunk

    def forward(self, input_ids, labels):
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        hidden = getattr(base, self.backbone)(input_ids=input_ids)[0]
        return [base.lm_head(part) for part in hidden.split(self.chunk, dim=1)], labels


def chunked_cross_entropy(output):
    chunks, labels = output
    losses = [
        functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        for logits, targets in zip(chunks, labels.split(chunks[0].shape[1], dim=1), strict=True)
    ]
    return torch.stack(losses).sum() / labels.numel()


def _bloom():
    return transformers.BloomConfig(hidden_size=256, n_layer=2, n_head=4, vocab_size=VOCAB)


def _llama():
    return transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
    )


def _real(config, backbone, *, dtype, lora, **knobs):
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    if lora:
        peft = pytest.importorskip("peft")
        targets = role_targets(lm, ["query", "value"])
        lm = peft.get_peft_model(lm, peft.LoraConfig(r=8, target_modules=targets))
    ids = torch.randint(0, VOCAB, (2, SEQ))
    step = ChunkedHead(lm, backbone, CHUNK)
    return measure_step(
        step,
        {"input_ids": ids, "labels": ids},
        device="cpu",
        optimizer="adamw",
        loss_fn=chunked_cross_entropy,
        **knobs,
    ).peak


KNOBS = [{}, {"gradient_accumulation_steps": 2}, {"keep_output": True}, {"set_to_none": False}]


@pytest.mark.parametrize("knobs", KNOBS, ids=str)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_meta_pass_follows_a_real_chunked_step(knobs, lora):
    # BLOOM has no closed form: the estimate is the meta pass with the loss in chunks
    real = _real(_bloom(), "transformer", dtype=torch.float32, lora=lora, **knobs)
    adapters = {"lora_rank": 8, "lora_targets": ["query", "value"]} if lora else {}
    found = estimate(
        _bloom(),
        batch_size=2,
        seq_len=SEQ,
        dtype="fp32",
        device="cpu",
        loss_chunk_size=CHUNK,
        **adapters,
        **knobs,
    )
    assert -0.01 <= found.total / real - 1 <= 0.04, (found.total, real)
    assert any(f"chunks of {CHUNK} positions" in note for note in found.notes)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_closed_form_follows_a_real_chunked_step(dtype):
    # a trained head: each chunk's weight gradient is summed into the last, out of place
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    real = _real(_llama(), "model", dtype=torch_dtype, lora=False)
    found = estimate(
        _llama(),
        batch_size=2,
        seq_len=SEQ,
        dtype=dtype,
        mixed_precision=False,
        device="cpu",
        loss_chunk_size=CHUNK,
    )
    assert "closed form" in found.notes[0]
    assert -0.01 <= found.total / real - 1 <= 0.04, (found.total, real)


def test_one_chunk_is_no_chunking_and_more_chunks_never_cost_more_at_the_start():
    common = dict(batch_size=2, seq_len=SEQ, dtype="fp32", device="cpu", optimizer="sgd")
    whole = estimate(_bloom(), **common)
    one = estimate(_bloom(), loss_chunk_size=SEQ, **common)
    assert one.total == whole.total or abs(one.total / whole.total - 1) < 0.01
    small = estimate(_bloom(), loss_chunk_size=CHUNK, **common)
    assert small.total < whole.total


def test_an_encoder_decoder_is_refused_with_the_reason_and_the_fix():
    config = transformers.T5Config(num_layers=1, d_model=32, d_ff=64, num_heads=2, vocab_size=100)
    with pytest.raises(ValueError, match=r"loss_chunk_size=8 .*encoder-decoder.*trace_step"):
        estimate(config, batch_size=1, seq_len=16, loss_chunk_size=8)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(config)
    assert "encoder-decoder" in chunk_refusal(model)


FAMILIES = {
    "phi": (
        transformers.PhiConfig,
        dict(hidden_size=32, intermediate_size=64, num_attention_heads=2),
        {"query": ["self_attn.q_proj"], "mlp": ["mlp.fc1", "mlp.fc2"]},
    ),
    "gpt_neox": (
        transformers.GPTNeoXConfig,
        dict(hidden_size=32, intermediate_size=64, num_attention_heads=2),
        {"value": ["attention.query_key_value"], "projection": ["attention.dense"]},
    ),
    "falcon": (
        transformers.FalconConfig,
        dict(hidden_size=32, num_attention_heads=2),
        {"query": ["self_attention.query_key_value"], "head": ["lm_head"]},
    ),
    "opt": (
        transformers.OPTConfig,
        dict(hidden_size=32, ffn_dim=64, num_attention_heads=2, word_embed_proj_dim=32),
        {"projection": ["self_attn.out_proj"], "mlp": ["fc1", "fc2"]},
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_litgpt_role_names_find_each_familys_modules(family):
    make, sizes, expected = FAMILIES[family]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            make(num_hidden_layers=2, vocab_size=64, **sizes)
        )
    for role, suffixes in expected.items():
        found = role_targets(model, [role])
        # every layer's module, and nothing else
        assert len(found) == (1 if role == "head" else 2 * len(suffixes)), found
        assert all(any(name.endswith(s) for s in suffixes) for name in found), found
    # a Linear's own name goes to PEFT untouched; a role no module plays is refused
    assert role_targets(model, ["lm_head"]) == ["lm_head"]
    with pytest.raises(ValueError, match="plays the role"):
        role_targets(torch.nn.Sequential(torch.nn.Linear(4, 4)), ["query"])


@settings(max_examples=60, deadline=None)
@given(
    activations=st.integers(0, 2**34),
    head=st.integers(0, 2**28),
    rows=st.integers(1, 16),
    seq=st.integers(1, 8192),
    chunk=st.integers(1, 8192),
    vocab=st.integers(1, 2**18),
    itemsize=st.sampled_from([2, 4]),
    kept=st.booleans(),
)
def test_the_chunked_peak_is_zero_for_one_chunk_and_never_below_the_forward_end(
    activations, head, rows, seq, chunk, vocab, itemsize, kept
):
    peak = chunked_loss_peak(
        activations,
        head_params=head,
        itemsize=itemsize,
        rows=rows,
        seq_len=seq,
        chunk=chunk,
        vocab=vocab,
        logits_kept=kept,
    )
    if chunk >= seq:
        assert peak == 0
        return
    logits = 0 if kept else rows * seq * vocab * itemsize
    assert peak >= activations + logits
    frozen = chunked_loss_peak(
        activations,
        head_params=0,
        itemsize=itemsize,
        rows=rows,
        seq_len=seq,
        chunk=chunk,
        vocab=vocab,
        logits_kept=kept,
    )
    assert frozen <= peak
