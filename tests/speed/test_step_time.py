"""step_time and compare_gpus: what they answer, and clear errors for bad input."""

import pytest
import torch
from torch import nn

from torchfit import Step, fits
from torchfit.speed import StepTime, compare_gpus, step_time

transformers = pytest.importorskip("transformers")
TINY = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)


def test_checkpointing_costs_about_one_more_forward_and_lora_less_backward():
    plain = step_time(TINY, "H100", batch_size=4, seq_len=128, precision="bf16-true")
    again = step_time(
        TINY, "H100", batch_size=4, seq_len=128, precision="bf16-true", gradient_checkpointing=True
    )
    assert again.seconds > plain.seconds
    # recomputation is subtracted as one forward (embedding and head included): close
    assert again.model_flops == pytest.approx(plain.model_flops, rel=0.1)
    lora = step_time(TINY, "H100", batch_size=4, seq_len=128, precision="bf16-true", lora_rank=8)
    assert lora.phase_seconds("backward") < plain.phase_seconds("backward")


def test_faster_card_is_faster_and_inference_is_faster_than_training():
    kw = {"batch_size": 8, "seq_len": 128, "precision": "bf16-mixed"}
    h100, t4 = step_time(TINY, "H100", **kw), step_time(TINY, "T4", **kw)
    assert h100.seconds < t4.seconds
    forward = step_time(TINY, "H100", batch_size=8, seq_len=128, mode="inference", dtype="bf16")
    assert forward.seconds < h100.seconds
    assert h100.tokens == 8 * 128 and h100.tokens_per_s == pytest.approx(1024 / h100.seconds)


def test_a_module_with_an_input_shape_is_timed():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    found = step_time(model, "A100 80GB", batch_size=16, input_shape=(3, 32, 32))
    assert isinstance(found, StepTime) and found.tokens is None
    assert {row.kind for row in found.breakdown} >= {"conv", "matmul", "memory"}
    text = str(found)
    assert "ms per step" in text and "conv" in text
    assert found.to_dict()["samples_per_s"] == pytest.approx(found.samples_per_s)


def test_compare_gpus_table_and_costs():
    table = compare_gpus(
        TINY,
        ["H100", "L4"],
        batch_size=4,
        seq_len=128,
        precision="bf16-mixed",
        tokens=1e8,
        price_per_hour={"H100": 3.0},
    )
    h100, l4 = table.rows
    assert h100.fits and l4.fits and h100.time.seconds < l4.time.seconds
    assert h100.cost == pytest.approx(3.0 * h100.hours) and l4.cost is None
    assert "NVIDIA L4" in str(table) and table.to_dict()["rows"][0]["gpu"] == "NVIDIA H100 SXM"


def test_cards_that_run_the_same_step_share_its_estimates(monkeypatch):
    # a traced step costs about a second a size: the second card of a comparison asks
    # again only the sizes the first did not (RTX 4090 and L40S: 24 and 48 GB, the same step)
    from torchfit.memory.plan import device

    asked = []
    real = device.estimate

    def counted(model, step):
        asked.append(step)
        return real(model, step)

    monkeypatch.setattr(device, "estimate", counted)
    table = compare_gpus(TINY, ["RTX 4090", "L40S"], seq_len=128, precision="bf16-mixed")
    assert table.rows[0].largest_batch < table.rows[1].largest_batch
    assert len(asked) == len(set(asked)), [s.batch_size for s in asked]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be a whole number >= 1; got 0"),
        ({"batch_size": 2.5}, TypeError, r"batch_size"),
        ({"batch_size": 1, "precision": "bf17"}, ValueError, r"unknown precision 'bf17'.*expected"),
        ({"batch_size": 1, "mode": "serve"}, ValueError, r"unknown mode 'serve'; expected"),
        ({"batch_size": 1, "optimizer_implementation": "fused"}, TypeError, r"adamw-fused"),
        ({"batch_size": 1, "trainable_params": 1000}, ValueError, r"lora_rank=.*leave"),
        ({"batch_size": 1, "frozen_base": True}, ValueError, r"frozen_base=True\) without"),
        ({"batch_size": 1, "device": "cpu"}, ValueError, r"Step\(device='cpu'\).*leave device"),
        ({"batch_size": 1, "optimizer": "adamx"}, ValueError, r"adamx"),
        ({"batch_size": 1, "seq_len": 4096}, ValueError, r"seq_len=4096 is beyond.*128"),
        ({"batch_size": 1, "input_shape": (3, 8, 8)}, ValueError, r"give seq_len= instead"),
        (
            {"batch_size": 1, "max_new_tokens": 4},
            ValueError,
            r"max_new_tokens=4 describes generation.*mode='inference'",
        ),
    ],
)
def test_bad_input_names_the_value_the_expectation_and_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        step_time(TINY, "H100", **kwargs)


def test_bad_card_and_module_without_shape():
    with pytest.raises(ValueError, match=r"GPU\.custom"):
        step_time(TINY, "no such card 9000", batch_size=1)
    with pytest.raises(ValueError, match=r"input_shape=\(\.\.\.\)"):
        step_time(nn.Linear(4, 4), "H100", batch_size=1)


def test_hours_and_cost_refuse_bad_amounts():
    found = step_time(TINY, "H100", batch_size=2, seq_len=64)
    with pytest.raises(ValueError, match="exactly one of tokens="):
        found.hours()
    with pytest.raises(ValueError, match="needs dataset_size="):
        found.hours(epochs=2)
    with pytest.raises(ValueError, match="price_per_hour must be a finite number >= 0"):
        found.cost(-1.0, tokens=1e6)
    with pytest.raises(TypeError, match="price_per_hour must be a number"):
        found.cost("2$", tokens=1e6)
    assert found.hours(epochs=2, dataset_size=10) == pytest.approx(found.hours(samples=20))


def test_compare_refuses_a_price_for_a_card_not_compared():
    with pytest.raises(ValueError, match=r"price_per_hour names cards not compared: \['A100'\]"):
        compare_gpus(TINY, ["H100"], batch_size=1, seq_len=64, price_per_hour={"A100": 1.0})


def test_quantized_base_adds_dequantization_kernels():
    plain = step_time(TINY, "H100", batch_size=2, seq_len=64, precision="bf16-mixed", lora_rank=8)
    qlora = step_time(
        TINY, "H100", batch_size=2, seq_len=64, precision="bf16-mixed", dtype="nf4", lora_rank=8
    )
    assert "dequant" not in {r.kind for r in plain.breakdown}
    assert {r.phase for r in qlora.breakdown if r.kind == "dequant"} == {"forward", "backward"}
    assert torch.float32  # the module stays importable with torch alone


def test_a_quantized_head_is_dequantized_at_each_call_too():
    """Lightning Fabric's BitsandbytesPrecision (LitGPT's --quantize) converts the head too."""
    step = Step(batch_size=2, seq_len=64, precision="bf16-true", quantization="nf4", lora_rank=8)
    blocks = step_time(TINY, "H100", step)
    every = step_time(TINY, "H100", step.replace(quantize_head=True))

    def dequantized(timed):
        return sum(r.bytes for r in timed.breakdown if r.kind == "dequant")

    # forward and backward each dequantize the head: 2 x its weights at 2.5 bytes (nf4 read,
    # bf16 written) more
    head = TINY.vocab_size * TINY.n_embd
    assert dequantized(every) - dequantized(blocks) == pytest.approx(2 * head * 2.5, rel=0.01)
    assert every.seconds > blocks.seconds


def test_4_bit_layers_computing_in_fp32_run_fp32_matmuls_and_the_casts():
    """BitsAndBytesConfig's default compute dtype on a bf16 model: each 4-bit layer casts its
    input to fp32, multiplies in fp32 (no tensor cores without TF32) and casts back."""
    step = Step(batch_size=2, seq_len=64, mode="inference", quantization="nf4")
    bf16 = step_time(TINY, "H100", step)
    fp32 = step_time(TINY, "H100", step.replace(bnb_compute_dtype="fp32"))

    def total(timed, kind, field):
        return sum(getattr(r, field) for r in timed.breakdown if r.kind == kind)

    assert total(fp32, "memory", "kernels") > total(bf16, "memory", "kernels")  # the casts
    assert total(fp32, "matmul", "seconds") > total(bf16, "matmul", "seconds")
    assert total(fp32, "dequant", "bytes") > total(bf16, "dequant", "bytes")  # fp32 copies
    assert any("compute in fp32 (bnb_4bit_compute_dtype)" in n for n in fp32.notes)


def test_qlora_holds_quantized_weights_in_compute_dtype_and_the_rest_in_fp32():
    from torchfit.speed.workload import hold_quantized_in

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)  # fp32, as prepare_model_for_kbit_training
    hold_quantized_in(model, torch.bfloat16)
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.dtype == layer.mlp.down_proj.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32  # bitsandbytes skips the head
    assert layer.input_layernorm.weight.dtype == torch.float32


def test_channels_last_spares_the_nchw_transposes_on_tensor_cores():
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3))
    kw = {"batch_size": 64, "input_shape": (64, 56, 56), "precision": "bf16-true"}
    nchw = step_time(model, "H200", **kw)
    nhwc = step_time(model, "H200", channels_last=True, **kw)
    conv = [sum(r.seconds for r in t.breakdown if r.kind == "conv") for t in (nchw, nhwc)]
    assert conv[1] < conv[0]


def test_a_quantized_linear_casts_its_output_back_to_an_fp32_input():
    from torchfit.speed.record import OpRecorder
    from torchfit.speed.workload import _cast_back_hooks

    recorder = OpRecorder()
    linear = nn.Linear(8, 16)
    handles = _cast_back_hooks(linear, recorder)
    x = torch.ones(4, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x)  # bf16 out of an fp32 input, as Linear4bit's matmul before .to()
    out.float().sum().backward()
    for handle in handles:
        handle.remove()
    casts = [op for op in recorder.ops if op.name == "_to_copy"]
    # forward: the bf16 output read, written again in fp32; backward: the gradient back
    assert [op.bytes for op in casts] == [4 * 16 * 6.0, 4 * 16 * 6.0]


def test_channels_last_leaves_the_callers_module_as_it_was():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    step_time(model, "H200", batch_size=2, input_shape=(3, 16, 16), channels_last=True)
    assert model[0].weight.is_contiguous()


def test_a_step_times_as_its_keywords_and_refuses_keywords_beside_it():
    step = Step(batch_size=4, seq_len=128, precision="bf16-mixed", lora_rank=8)
    by_step = step_time(TINY, "H100", step)
    by_keywords = step_time(TINY, "H100", batch_size=4, seq_len=128, precision="bf16-mixed",
                            lora_rank=8)  # fmt: skip
    assert by_step.seconds == by_keywords.seconds and by_step.breakdown == by_keywords.breakdown
    with pytest.raises(TypeError, match=r"a Step and step keywords \(seq_len=\) together"):
        step_time(TINY, "H100", step, seq_len=64)
    with pytest.raises(TypeError, match=r"step must be Step or None; got \{'batch_size': 4\}"):
        step_time(TINY, "H100", {"batch_size": 4})


def test_without_a_precision_the_card_picks_it_as_fits_does():
    t4 = step_time(TINY, "T4", batch_size=4, seq_len=128)  # no native bf16: fp16 autocast
    plan = fits(TINY, "T4", batch_size=4, seq_len=128)
    assert plan.step.precision == "16-mixed"
    assert any("mixed fp16" in note for note in t4.notes)
    assert t4.seconds == step_time(TINY, "T4", plan.step).seconds
    h100 = step_time(TINY, "H100", batch_size=4, seq_len=128)
    assert any("mixed bf16" in note for note in h100.notes)


def test_the_optimizer_names_its_implementation_and_in_backward_runs_a_loop():
    kw = {"batch_size": 2, "seq_len": 64, "precision": "bf16-mixed"}

    def optimizer_seconds(**more):
        found = step_time(TINY, "H100", **kw, **more)
        return sum(r.seconds for r in found.breakdown if r.phase == "optimizer")

    foreach, fused = optimizer_seconds(), optimizer_seconds(optimizer="adamw-fused")
    loop = optimizer_seconds(optimizer="adamw-for-loop")
    assert fused < foreach < loop
    assert optimizer_seconds(optimizer_in_backward=True) == pytest.approx(loop)


def test_memory_only_fields_leave_the_time_alone_the_fp32_cast_does_not():
    kw = {"batch_size": 2, "seq_len": 64, "precision": "bf16-mixed"}
    plain = step_time(TINY, "H100", **kw)
    kept = step_time(TINY, "H100", **kw, keep_output=True, set_to_none=False)
    assert kept.seconds == plain.seconds
    chunked = step_time(TINY, "H100", **kw, loss_chunk_size=16)
    assert any("chunks of 16 positions" in note for note in chunked.notes)
    assert not any("chunks" in note for note in plain.notes)
    # the loop's cast of the outputs to fp32 is a kernel of its own
    cast = step_time(TINY, "H100", **{**kw, "precision": "bf16-true"}, fp32_output=True)
    assert cast.seconds > step_time(TINY, "H100", **{**kw, "precision": "bf16-true"}).seconds


def test_compare_gpus_takes_a_step_and_its_batch_unless_asked_for_the_largest():
    step = Step(batch_size=2, seq_len=128, precision="bf16-mixed")
    table = compare_gpus(TINY, ["H100", "L4"], step)
    assert [row.batch_size for row in table.rows] == [2, 2]
    assert table.rows[0].time.seconds == step_time(TINY, "H100", step).seconds
    largest = compare_gpus(TINY, ["L4"], step, at_largest_batch=True)
    assert largest.rows[0].batch_size == largest.rows[0].largest_batch > 2
    with pytest.raises(ValueError, match=r"batch_size=2 and at_largest_batch=True"):
        compare_gpus(TINY, ["L4"], batch_size=2, seq_len=64, at_largest_batch=True)


def test_results_repr_in_one_short_line_and_print_the_table():
    table = compare_gpus(TINY, ["H100", "L4"], batch_size=2, seq_len=64, precision="bf16-mixed")
    fastest = max(table.rows, key=lambda row: row.time.tokens_per_s)
    for shown in (table, *table.rows, table.rows[0].time):
        text = repr(shown)
        assert "\n" not in text and len(text) < 160, text
    assert repr(table).endswith(f"fastest {fastest.gpu}>")
    assert str(table.rows[0].time).count("\n") > 3  # print: the breakdown table


def test_peft_copies_a_4_bit_layers_output_before_adding_its_adapter(monkeypatch):
    """peft's LoRA over bitsandbytes' Linear4bit clones the base's output (the fp32 output
    of a prepared base: read and written once more), each forward."""
    from torchfit.speed import workload

    step = Step(batch_size=2, seq_len=64, precision="bf16-mixed", quantization="nf4")
    step = step.replace(lora_rank=8, lora_targets=("c_attn",))

    def forward_bytes(timed):
        return sum(r.bytes for r in timed.breakdown if (r.kind, r.phase) == ("memory", "forward"))

    cloned = step_time(TINY, "H100", step)
    monkeypatch.setattr(workload, "_defensive_clone", lambda recorder: lambda *_: None)
    plain = step_time(TINY, "H100", step)
    tokens, out = 2 * 64, 3 * TINY.n_embd  # c_attn's output: q, k and v
    expected = TINY.n_layer * tokens * out * 2 * 4  # fp32, read and written
    assert forward_bytes(cloned) - forward_bytes(plain) == pytest.approx(expected)
