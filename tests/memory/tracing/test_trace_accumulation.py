"""The trace sums gradients into a new tensor exactly where autograd's engine does.

Where several nodes send a gradient to one input (a residual stream, q/k/v reading one
norm's output, a tied head and embedding), the engine adds them, into the first one's
memory when it is a plain tensor it holds alone and into a new tensor otherwise. Fake
tensors always take the second way, so the tracker redoes the first where it applies.
The reference is the engine itself: the same step on real (tiny) CPU tensors under
``torch.profiler``, whose out-of-place ``aten::add`` calls in backward are the sums that
allocate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from torch.profiler import ProfilerActivity, profile

from torchfit.memory.tracing.tracer import trace_events

transformers.logging.set_verbosity_error()

VOCAB = 512


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB)
    return transformers.GPT2LMHeadModel(config)


def _llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=VOCAB,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def _conv_block() -> torch.nn.Module:
    conv = [torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(2)]
    norm = [torch.nn.BatchNorm2d(16) for _ in range(2)]
    return torch.nn.Sequential(conv[0], norm[0], torch.nn.ReLU(), conv[1], norm[1])


class _ResidualCNN(torch.nn.Module):
    """Two residual conv blocks with BatchNorm, pooled into a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = torch.nn.ModuleList(_conv_block() for _ in range(2))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = torch.relu(h + block(h))
        return self.head(h.mean((2, 3)))


class _Doubled(torch.nn.Module):
    """``h + h``: autograd sends one gradient tensor twice to ``h``'s buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        return self.second(h + h)


def _encoder() -> torch.nn.Module:
    """PyTorch's own pre-norm encoder layers (``nn.MultiheadAttention``) on embeddings."""
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, norm_first=True)
    stack = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), stack)


#: name -> (model, inputs, loss from the output)
CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], Any], Callable[[Any], Any]]] = {
    "gpt2": (_gpt2, lambda: _tokens(labels=True), lambda out: out.loss),
    "llama-tied": (_llama, lambda: _tokens(labels=True), lambda out: out.loss),
    "bert": (_bert, lambda: _tokens(labels=True), lambda out: out.loss),
    "residual-cnn": (_ResidualCNN, lambda: torch.randn(2, 3, 8, 8), lambda out: out.sum()),
    "doubled": (_Doubled, lambda: torch.randn(4, 32), lambda out: out.sum()),
    "torch-encoder": (_encoder, lambda: _tokens(labels=False), lambda out: out.float().sum()),
}


def _tokens(*, labels: bool) -> Any:
    ids = torch.randint(0, VOCAB, (2, 16))
    return {"input_ids": ids, "labels": ids} if labels else ids


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def _real_sums(model: torch.nn.Module, inputs: Any, loss_of: Any, autocast: bool) -> int:
    """Out-of-place adds in the real engine's backward of one step."""
    model.zero_grad(set_to_none=True)
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with cast:
        loss = loss_of(_call(model, inputs))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    return sum(event.name == "aten::add" for event in prof.events())


def _traced_sums(model: torch.nn.Module, inputs: Any, loss_of: Any, autocast: bool) -> int:
    """Storages the trace's backward allocates with ``aten.add.Tensor``."""
    precision = "bf16-mixed" if autocast else "32-true"
    traced = trace_events(model, inputs, precision=precision, loss_fn=loss_of)
    return sum(s.phase == "backward" and s.op == "aten.add.Tensor" for s in traced.storages)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_trace_allocates_the_sums_the_engine_allocates(name: str, autocast: bool) -> None:
    torch.manual_seed(0)
    build, make_inputs, loss_of = CASES[name]
    model, inputs = build().train(), make_inputs()
    real = _real_sums(model, inputs, loss_of, autocast)
    assert _traced_sums(model, inputs, loss_of, autocast) == real


def test_a_tied_head_under_autocast_adds_the_embeddings_gradient_in_place() -> None:
    """The cast's backward hands the head's gradient over fresh: no sum is allocated."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 16))
    sums = {
        autocast: [
            s
            for s in trace_events(
                _llama().train(),
                {"input_ids": ids, "labels": ids},
                precision="bf16-mixed" if autocast else "32-true",
            ).storages
            if s.op == "aten.add.Tensor" and "EmbeddingBackward0" in s.module
        ]
        for autocast in (False, True)
    }
    assert len(sums[False]) == 1  # the head's gradient is a transposed view: a new sum
    assert sums[True] == []
