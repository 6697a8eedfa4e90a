"""torchfit against real GPU runs that others measured and published.

Every run of ``benchmarks/published_runs.toml`` (a figure or a fits / OOM verdict, with
its citation and setup; read by ``published_data.py``) is turned into the torchfit call
that describes the same run, its source's recipe stated in the data file, and the matching
quantity is compared: nvidia-smi with ``device_total``, ``max_memory_allocated`` and
``active_bytes.all.peak`` with ``total``, ``max_memory_reserved`` with ``reserved``; a
verdict with whether ``device_needed`` (the OOM line `fits` decides on) fits the card, and
a maximum-context row (``longest``) with the longest sequence whose ``device_needed``
fits (``published_longest.py``). A setup torchfit cannot express yet is listed with the
reason, never approximated silently; what a source's recipe has that torchfit does not
model is listed by source. Ambiguous cases and the held-out set are reported apart.

Run: python benchmarks/published.py            (markdown tables, about a minute)
     python benchmarks/published.py --heldout  (the held-out set only)
     python benchmarks/published.py --readme   (the README's "How accurate" paragraph)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from published_data import Case, Source, load
from published_longest import longest_fitting, longest_table
from published_models import adam_of, flash_v1_of, rasbt_step, torchvision_vit_l_16

from torchfit.memory import GPU, MemoryEstimate, estimate, gpu, to_device
from torchfit.memory.catalog.resolve import resolve_model
from torchfit.memory.tracing.result import Trace
from torchfit.memory.tracing.user_step import trace_step

#: Cards the sources name, as torchfit's catalog knows them.
CARDS = {
    "Tesla V100-SXM2 16GB": "V100 16GB",
    "NVIDIA A100-SXM4-40GB": "A100 40GB",
    "A100 40GB": "A100 40GB",
    "NVIDIA A10G 24GB (1xA10G)": "A10G",
    "A100 (memory size not stated)": "A100 80GB",
    # Prem AI: 'A100 80 GPU'; SXM and PCIe hold the same 80 GB
    "A100 80GB (form factor not stated)": "A100 80GB",
    "NVIDIA A100 80GB": "A100 80GB",
}
#: Allocator statistics barely depend on the card; where none is named, this one is used.
DEFAULT_CARD = "A100 80GB"
#: "N GB VRAM (card not named)": unsloth's context-length tables give a memory size per row
#: and no card (the 70B table says it ran on an 80GB A100): such a row is that A100 with N
#: GiB, so its CUDA context and kernels are the A100's and only the memory differs.
_VRAM_ONLY = re.compile(r"^(\d+) GB VRAM \(card not named\)$")


def card_of(case: Case) -> GPU:
    """The card ``case`` ran on, as torchfit's catalog knows it (see `CARDS`, `_VRAM_ONLY`)."""
    size = _VRAM_ONLY.match(case.gpu or "")
    if size is None:
        return gpu(CARDS.get(case.gpu or "", DEFAULT_CARD))
    memory = int(size[1]) * 2**30
    return dataclasses.replace(gpu(DEFAULT_CARD), name=str(case.gpu), memory=memory, aliases=())


#: Hub ids of the sources -> torchfit catalog names.
#: Every other model goes by its Hub id through torchfit's resolver (offline: the catalog).
MODELS = {
    # a LoRA fine-tune of Llama-3-8B-Instruct merged back: Llama-3-8B's architecture
    "meta-llama/Meta-Llama-3-8B-Instruct (LoRA-finetuned, merged)": "llama-3-8b",
    # chat / instruct fine-tunes keep their base's config (Prem AI's runs)
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "mistralai/Mistral-7B-Instruct-v0.1": "mistral-7b",
    # Qwen2.5 Instruct models: the base configs' shapes (the catalog's larger
    # max_position_embeddings changes nothing at these lengths)
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-3B-Instruct": "qwen2.5-3b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "Qwen/Qwen2.5-14B-Instruct": "qwen2.5-14b",
    "Qwen/Qwen2.5-32B-Instruct": "qwen2.5-32b",
}

#: Models the catalog cannot build here, rebuilt from their library's source as plain
#: modules (benchmarks/published_models.py): torchvision's vit_l_16, whose blocks use
#: nn.MultiheadAttention (torchvision does not install beside this torch).
MODULES: dict[str, Callable[..., Any]] = {
    "torchvision vit_l_16 (10-class head)": lambda **kw: torchvision_vit_l_16(classes=10, **kw),
}

#: Precision as the sources write it -> estimate() keywords.
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {"dtype": "fp32"},
    "fp16-mixed": {"dtype": "fp16", "mixed_precision": True},
    "bf16-mixed": {"dtype": "bf16", "mixed_precision": True},
    "bf16-true": {"dtype": "bf16", "mixed_precision": False},
    "bf16": {"dtype": "bf16", "mixed_precision": False},
    "fp16": {"dtype": "fp16", "mixed_precision": False},
    # Lit-GPT / LitGPT quantize through Lightning Fabric's BitsandbytesPrecision, which
    # converts each weight to float16 before quantize_4bit (plugins/precision/
    # bitsandbytes.py), so its 4-bit weights dequantize to fp16, then copy to bf16
    "bf16-true + bnb.nf4 base": {
        "dtype": "nf4",
        "precision": "bf16-true",
        "double_quant": False,
        "base_dtype": "fp16",
    },
    "bf16-true + bnb.nf4-dq base": {"dtype": "nf4", "precision": "bf16-true", "base_dtype": "fp16"},
    # load_in_4bit=True alone: BitsAndBytesConfig's defaults, fp4 (4 bits + one fp32 absmax
    # per 64 weights, the same bytes as nf4) without double quantization, computed in fp32
    # (bnb_4bit_compute_dtype's default); transformers of 2023 loaded the model in float16
    # when a bitsandbytes load named no torch_dtype ("Overriding torch_dtype=None with
    # torch_dtype=torch.float16 due to requirements of bitsandbytes", modeling_utils.py)
    "4-bit bitsandbytes (load_in_4bit=True; quant type default, not named)": {
        "dtype": "nf4",
        "double_quant": False,
        "precision": "16-true",
        "bnb_compute_dtype": "fp32",
    },
    # LitGPT's generate/base.py --quantize bnb.nf4 / bnb.nf4-dq: every Linear in 4 bits (the
    # head too, see LITGPT), computed in bf16; the embedding and the norms stay bf16
    "bf16-true + bnb.nf4 weights": {
        "dtype": "nf4",
        "precision": "bf16-true",
        "double_quant": False,
        "base_dtype": "fp16",
    },
    "bf16-true + bnb.nf4-dq weights": {
        "dtype": "nf4",
        "precision": "bf16-true",
        "base_dtype": "fp16",
    },
    "bf16-true + bnb.nf4 weights (Fabric, every Linear)": {
        "dtype": "nf4",
        "precision": "bf16-true",
        "double_quant": False,
        "base_dtype": "fp16",
    },
    "bf16-true + bnb.nf4-dq weights (Fabric, every Linear)": {
        "dtype": "nf4",
        "precision": "bf16-true",
        "base_dtype": "fp16",
    },
    "16-true + bnb.int8 weights (Fabric, every Linear)": {"dtype": "int8", "precision": "16-true"},
    "bf16-true + nf4 base": {"dtype": "nf4", "precision": "bf16-true"},
    # torchao's NF4Tensor (torchtune's QLoRA base): 4-bit codes, an int8 scaler per block of
    # 64 and one bf16 factor per 256 scalers: 4 + 8/64 + 16/16384 bits per weight, within
    # 16 bits per 16384 weights of bitsandbytes' double-quantized nf4 (fp32 factor), so
    # torchfit's nf4 with double_quant=True counts its bytes
    "bf16-true + nf4 base (torchao)": {"dtype": "nf4", "precision": "bf16-true"},
    "bf16-true + nf4 base (torchao NF4Tensor)": {"dtype": "nf4", "precision": "bf16-true"},
    "int8 (bitsandbytes LLM.int8, load_in_8bit=True)": {"dtype": "int8"},
    # BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True, nf4, fp16 compute):
    # transformers' default skip list keeps lm_head in 16 bits (no quantize_head)
    "fp16 + bnb nf4-dq weights (transformers BitsAndBytesConfig, lm_head kept fp16)": {
        "dtype": "nf4",
        "double_quant": True,
    },
    # the Hugging Face QLoRA recipe (transformers' bitsandbytes docs, PEFT's quantization
    # guide): BitsAndBytesConfig(nf4, double quant, bf16 compute), trained under bf16 autocast;
    # prepare_model_for_kbit_training is the default of a 4-bit *-mixed step (kbit_prepare)
    "bf16-mixed + bnb nf4-dq base (BitsAndBytesConfig, bf16 compute)": {
        "dtype": "nf4",
        "precision": "bf16-mixed",
        "double_quant": True,
    },
}

#: What each recipe's chunked cross-entropy chunks: LitGPT's lm_head_chunk_size=128 (the
#: finetune scripts' model(input_ids, lm_head_chunk_size=128)); torchtune's
#: CEWithChunkedOutputLoss, num_output_chunks=8 (a chunk of seq_len / 8 positions).
LOSS_CHUNKS: dict[str, Callable[[int], int]] = {
    "Lit-GPT": lambda _seq: 128,
    "litgpt": lambda _seq: 128,
    "torchtune": lambda seq: max(1, seq // 8),
}

OPTIMIZERS = {
    "adamw": "adamw",
    # torch.optim.AdamW(fused=True): torchtune's LoRA / QLoRA configs
    "adamw-fused": "adamw-fused",
    "adam": "adam",
    "sgd": "sgd",
    "adam-8bit": "adamw-8bit",
    "adamw-8bit": "adamw-8bit",
    "adafactor": "adafactor",
    "paged_adamw_32bit": "paged-adamw",
    "paged_adamw_8bit": "paged-adamw-8bit",
}

#: How each framework's training loop runs, read from its source at the cited version:
#: (zero_grad's set_to_none, whether the output is referenced through backward).
#: - The 2022 Hugging Face Trainer zeroes with ``model.zero_grad()``, PyTorch 1.x's
#:   default set_to_none=False, and computes the loss in ``compute_loss`` (outputs dropped).
#: - Lit-GPT's finetune/lora.py keeps ``logits`` in scope across ``fabric.backward``, and
#:   the Fabric-wrapped model hands them back in fp32: every Fabric precision plugin casts
#:   a module's floating outputs to the default dtype (``convert_output`` in
#:   lightning/fabric/plugins/precision/half.py, amp.py and bitsandbytes.py, since 2.1.0).
#: - torchtune's recipes ``del logits`` before backward.
#: - rasbt/pytorch-memory-optim's plain PyTorch / Fabric loops are traced as written
#:   (published_models.rasbt_step): zero_grad between forward and backward.
LOOPS: dict[str, dict[str, bool]] = {
    "transformers Trainer": {"set_to_none": False, "keep_output": False},
    "Lit-GPT": {"set_to_none": True, "keep_output": True, "fp32_output": True},
    "litgpt": {"set_to_none": True, "keep_output": True, "fp32_output": True},
    "torchtune": {"set_to_none": True, "keep_output": False},
    # Trainer of late 2024 (transformers 4.46-4.48, trainer.py _inner_training_loop):
    # model.zero_grad() after each optimizer step (torch 2's set_to_none=True), and
    # compute_loss returns the loss only (the outputs are dropped before backward)
    "Hugging Face transformers Trainer": {"set_to_none": True, "keep_output": False},
    # PEFT's method_comparison/MetaMathQA/run.py @ 5d602fd: optimizer.zero_grad() (torch 2's
    # set_to_none=True), then `outputs = model(**batch)` stays in scope through backward
    "PEFT 0.19": {"set_to_none": True, "keep_output": True},
}

#: Which torchfit figure a published quantity is compared with.
QUANTITY = {
    "nvidia-smi": "device_total",
    "max_memory_allocated": "total",
    "active_bytes.all.peak": "total",
    "max_memory_reserved": "reserved",
}


def source_of(case: Case) -> str:
    """The publication ``case`` comes from (its source's ``publication`` in the data file).

    One repository can hold several independent measurements (another author, year,
    script and machine), each its own publication.
    """
    return case.publication


#: Figures torchfit's own constants were set from: comparing with them tests nothing.
CALIBRATION = {
    "hf_cuda_context_v100": (
        "calibration: one of the eager contexts torchfit's EAGER_LIBRARY_BYTES "
        "(allocator/context.py) was set from"
    ),
}


class NotExpressible(Exception):  # noqa: N818 - a reason, not a failure
    """The case's setup has something torchfit cannot model yet."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One case compared (or the reason it could not be)."""

    case: Case
    heldout: bool
    predicted: int | None = None
    verdict: str | None = None
    reason: str = ""
    #: a maximum-context row (``case.longest``): the longest length torchfit fits on the card
    longest: int | None = None

    @property
    def error(self) -> float | None:
        """(torchfit - published) / published."""
        if self.predicted is None or self.case.value_bytes is None:
            return None
        return (self.predicted - self.case.value_bytes) / self.case.value_bytes


#: LoRA targets as the sources name them -> the names torchfit takes.
_TARGETS = (
    "query",
    "key",
    "value",
    "projection",
    "output_proj",
    "q_proj",
    "o_proj",
    "k_proj",
    "v_proj",
    "up_proj",
    "gate_proj",
    "down_proj",
    "mlp",
    "head",
)


def _lora(case: Case) -> dict[str, Any]:
    """``lora_rank``, ``lora_targets`` and ``lora_dropout`` from the source's LoRA text."""
    text = case.lora or ""
    rank = re.search(r"r=(\d+)", text)
    if rank is None:
        raise NotExpressible(f"LoRA rank not readable from {text!r}")
    if "DoRA" in text:
        raise NotExpressible("DoRA (its magnitude vector and the weight norm it computes)")
    targets = [name for name in _TARGETS if re.search(rf"\b{name}\b", text, re.IGNORECASE)]
    if not targets:
        raise NotExpressible(f"LoRA targets not readable from {text!r}")
    dropout = re.search(r"dropout (\d+(?:\.\d+)?)", text)
    return {
        "lora_rank": int(rank.group(1)),
        "lora_targets": targets,
        "lora_dropout": float(dropout.group(1)) if dropout else 0.0,
    }


#: Lit-GPT / LitGPT runs, whose own model and quantization differ from transformers':
#: - LitGPT's ``GPT`` never ties the output head to the token embedding: it has separate
#:   ``transformer.wte`` and ``lm_head`` parameters, and
#:   litgpt/scripts/convert_hf_checkpoint.py (@ 2685705, lines 205-206 and the other
#:   copy_weights_* functions) copies ``wte`` into ``lm_head`` when the Hugging Face
#:   checkpoint has none (Gemma, Llama 3.2): the run holds and trains two matrices.
#: - ``--quantize bnb.*`` goes through Fabric's ``BitsandbytesPrecision(mode, dtype)``
#:   (finetune/lora.py and generate/base.py @ 8641822 and @ 2685705), whose
#:   ``convert_module`` replaces every ``torch.nn.Linear`` not in ``ignore_modules`` (none
#:   given): the LM head is quantized too, unlike transformers' default skip list.
#: - Its phi configs set ``gelu_approximate="tanh"`` and its MLP calls
#:   ``torch.nn.functional.gelu(x, approximate="tanh")``: PyTorch's fused kernel, which
#:   saves its input only. transformers' Phi uses ``gelu_new``, the same curve written as
#:   a chain of tensor ops that saves four tensors: the run is expressed with transformers'
#:   ``gelu_pytorch_tanh``, which calls that fused kernel.
LITGPT = ("Lit-GPT", "litgpt")
#: transformers activations written out in Python -> the fused kernel LitGPT calls instead.
LITGPT_ACTIVATIONS = {"gelu_new": "gelu_pytorch_tanh"}


def setting(case: Case) -> tuple[Any, dict[str, Any]]:
    """The model (a catalog name or a config) and `estimate` keywords for ``case``.

    Raises:
        NotExpressible: something of the setup torchfit cannot model, with the reason.
    """
    model: Any = MODELS.get(case.model) or case.model
    try:
        resolved = resolve_model(model)
    except (OSError, ValueError) as error:
        raise NotExpressible(f"model {case.model!r}: {str(error).split(';')[0]}") from None
    config = resolved.config
    litgpt = (case.framework or "").startswith(LITGPT)
    if litgpt and config is not None:
        model = copy.deepcopy(config)
        model.tie_word_embeddings = False
        activation = getattr(config, "hidden_act", None)
        model.hidden_act = LITGPT_ACTIVATIONS.get(activation, activation)
    if case.precision not in PRECISIONS:
        raise NotExpressible(f"precision {case.precision!r}")
    kwargs: dict[str, Any] = dict(PRECISIONS[case.precision])
    if litgpt and kwargs.get("dtype") in {"nf4", "int8"}:
        kwargs["quantize_head"] = True
    kwargs["batch_size"] = case.batch_size or 1
    if case.seq_len is not None:
        kwargs["seq_len"] = case.seq_len
    elif case.measured == "oom":
        # the length is not given, but no length can use less than one token: if that
        # run does not fit either, the out-of-memory verdict holds whatever it was
        kwargs["seq_len"] = 1
    else:
        raise NotExpressible("sequence length not given")
    _versions(case, kwargs)
    if case.mode == "inference":
        kwargs["mode"] = "inference"
        kwargs.pop("mixed_precision", None)
        if case.attention is not None:
            kwargs["attn_implementation"] = case.attention
        if case.new_tokens is not None:  # generate(): the prompt, then one token at a time
            kwargs["seq_len"] -= case.new_tokens
            kwargs["max_new_tokens"] = case.new_tokens
        return model, kwargs
    _training(case, kwargs)
    return model, kwargs


def _versions(case: Case, kwargs: dict[str, Any]) -> None:
    """The bitsandbytes (for a quantized run) and torch versions ``case`` names.

    Default: the installed ones. What autograd keeps changed between torch releases.
    """
    bnb = re.search(r"bitsandbytes (\d+\.\d+\.\d+)", case.cuda_torch or "")
    if kwargs.get("dtype") in {"nf4", "int8"} and bnb is not None:
        kwargs["bitsandbytes_version"] = bnb.group(1)
    named = re.search(r"(?:PyTorch|torch) (\d+\.\d+\.\d+)", case.cuda_torch or "")
    if named is not None:
        kwargs["torch_version"] = named.group(1)


#: The dtype of a traced run's model (Fabric's "bf16-true" converts the model and inputs).
_TRACED_DTYPES = {"fp32": torch.float32, "bf16-true": torch.bfloat16, "fp16-mixed": torch.float32}
#: Fabric's "16-mixed": the module's forward under torch.autocast("cuda", torch.float16).
_TRACED_AUTOCAST = {"fp16-mixed": torch.float16}


def _traced(case: Case) -> Trace:
    """``case``'s own loop traced on fake tensors (a model in `MODULES`)."""
    dtype = _TRACED_DTYPES.get(str(case.precision))
    if dtype is None:
        raise NotExpressible(f"precision {case.precision!r} in a traced loop")
    model = MODULES[case.model](flash_v1=flash_v1_of(case.cuda_torch)).to(dtype)
    parameters = model.parameters()
    optimizer = (  # the scripts' Adam(lr=5e-5), as their PyTorch ran it; SGD(lr=0.01)
        adam_of(case.cuda_torch)(parameters, lr=5e-5)
        if case.optimizer == "adam"
        else torch.optim.SGD(parameters, lr=0.01)
    )
    batch, side = case.batch_size or 1, case.seq_len or 224
    images = torch.zeros(batch, 3, side, side, dtype=dtype, device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    autocast = _TRACED_AUTOCAST.get(str(case.precision))
    step = rasbt_step(accumulation=case.gradient_accumulation_steps or 1, autocast=autocast)
    return trace_step(step, model, optimizer, images, labels, device="cuda", warmup=1)


def _training(case: Case, kwargs: dict[str, Any]) -> None:
    """The training knobs of ``case``, added to ``kwargs``; NotExpressible if one has none."""
    kwargs["gradient_accumulation_steps"] = case.gradient_accumulation_steps or 1
    if case.optimizer not in OPTIMIZERS:
        raise NotExpressible(f"optimizer {case.optimizer!r}")
    kwargs["optimizer"] = OPTIMIZERS[case.optimizer]
    loop = next((v for k, v in LOOPS.items() if (case.framework or "").startswith(k)), None)
    if loop is None:
        raise NotExpressible(f"the training loop of {case.framework!r} is not known")
    kwargs.update(loop)
    tricks = set(case.other_tricks) - {"packed sequences", "chunked CE", "optimizer in backward"}
    if tricks:
        raise NotExpressible(f"not modelled: {', '.join(sorted(tricks))}")
    if "optimizer in backward" in case.other_tricks:
        kwargs["optimizer_in_backward"] = True
    # LitGPT's full fine-tuning (finetune/full.py @ 2685705) runs the head over the whole
    # sequence and chunks only the cross-entropy over those logits: not a chunked head
    whole_head = (case.framework or "").startswith(LITGPT) and case.method == "full"
    if "chunked CE" in case.other_tricks and not whole_head:
        chunk = next(v for k, v in LOSS_CHUNKS.items() if (case.framework or "").startswith(k))
        kwargs["loss_chunk_size"] = chunk(kwargs["seq_len"])
    kwargs["gradient_checkpointing"] = bool(case.gradient_checkpointing)
    if case.attention is not None:
        kwargs["attn_implementation"] = case.attention
    if case.method in {"lora", "qlora"}:
        kwargs.update(_lora(case))


def on_device(case: Case) -> tuple[MemoryEstimate, GPU]:
    """torchfit's device view of ``case`` and the card it ran on.

    Raises:
        NotExpressible: a setup torchfit cannot model (or refuses), with the reason.
    """
    if case.key in CALIBRATION:
        raise NotExpressible(CALIBRATION[case.key])
    card = card_of(case)
    version = re.search(r"CUDA (\d+\.\d+)", case.cuda_torch or "")
    cuda = None if version is None else version.group(1)
    if case.model in MODULES:  # traced: the exact allocation sequence gives `reserved`
        trace = _traced(case)
        return to_device(trace.estimate, gpu=card, cuda_version=cuda, events=trace.events), card
    model, kwargs = setting(case)
    try:
        found = estimate(model, **kwargs)
    except ValueError as error:  # a setting torchfit refuses for this model
        raise NotExpressible(str(error).split(";")[0]) from None
    return to_device(found, gpu=card, cuda_version=cuda), card


def longest_on_card(case: Case, card: GPU) -> int:
    """The longest ``seq_len`` whose OOM line fits ``card``, ``case``'s setting otherwise."""
    model, _ = setting(dataclasses.replace(case, seq_len=1, longest=False))
    config = resolve_model(model).config
    limit = int(getattr(config, "max_position_embeddings", None) or 2**20)

    def needed(length: int) -> int:
        return on_device(dataclasses.replace(case, seq_len=length, longest=False))[0].device_needed

    return longest_fitting(needed, card.total, start=case.seq_len or 1, limit=limit)


def compare(case: Case, *, heldout: bool) -> Row:
    """Estimate ``case`` and read the figure its source measured."""
    try:
        device, card = on_device(case)
    except NotExpressible as reason:
        return Row(case, heldout, reason=str(reason))
    if case.measured in {"fits", "oom"}:
        # the OOM line: what the card must hold for the step to run (what `fits` decides on)
        fits = device.device_needed <= card.total
        longest = longest_on_card(case, card) if case.longest else None
        if fits and case.seq_len is None:
            reason = "sequence length not given (one token fits)"
            if longest is not None:
                reason += f"; torchfit's longest on this card: {longest:,} tokens"
            return Row(case, heldout, reason=reason, longest=longest)
        verdict = "fits" if fits else "oom"
        return Row(case, heldout, device.device_needed, verdict, longest=longest)
    quantity = QUANTITY.get(case.measured)
    if quantity is None:
        return Row(case, heldout, reason=f"quantity {case.measured!r} has no torchfit twin")
    return Row(case, heldout, int(getattr(device, quantity)))


def _gib(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| case | measured | published GiB | torchfit GiB | error |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        error = "" if row.error is None else f"{row.error:+.1%}"
        lines.append(
            f"| {row.case.key} | {row.case.measured} | {_gib(row.case.value_bytes)} "
            f"| {_gib(row.predicted)} | {error} |"
        )
    return lines


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one set of compared cases comes to: the lines every section opens with."""

    figures: int
    verdicts: int
    #: median |error| and the signed extremes over the figures (None without figures)
    median: float | None = None
    lowest: float | None = None
    highest: float | None = None
    #: figures under by more than 10% (an under-estimate is an out-of-memory error)
    under: int = 0
    #: verdicts agreeing with what happened
    agree: int = 0

    def lines(self) -> list[str]:
        """The summary as the report prints it (``read_summary`` reads it back)."""
        lines = [f"- compared: {self.figures} figures, {self.verdicts} verdicts"]
        if self.median is not None:
            lines.append(
                f"- median |error| {self.median:.1%}; signed from {self.lowest:+.1%} to "
                f"{self.highest:+.1%}; under by more than 10%: {self.under}"
            )
        if self.verdicts:
            lines.append(f"- verdicts agreeing with what happened: {self.agree} of {self.verdicts}")
        return lines


def summarize(rows: list[Row]) -> Summary:
    """The `Summary` of compared rows."""
    errors = [row.error for row in rows if row.error is not None]
    verdicts = [row for row in rows if row.verdict is not None]
    agree = sum(row.verdict == row.case.measured for row in verdicts)
    if not errors:
        return Summary(0, len(verdicts), agree=agree)
    return Summary(
        figures=len(errors),
        verdicts=len(verdicts),
        median=statistics.median(abs(e) for e in errors),
        lowest=min(errors),
        highest=max(errors),
        under=sum(e < -0.10 for e in errors),
        agree=agree,
    )


_COMPARED = re.compile(r"^- compared: (\d+) figures, (\d+) verdicts$")
_ERRORS = re.compile(
    r"^- median \|error\| ([\d.]+)%; signed from ([+-][\d.]+)% to ([+-][\d.]+)%; "
    r"under by more than 10%: (\d+)$"
)
_AGREE = re.compile(r"^- verdicts agreeing with what happened: (\d+) of \d+$")


def read_summary(markdown: str, title: str) -> Summary:
    """The `Summary` under the heading that starts with ``title`` in a printed report.

    Reads what `Summary.lines` printed, wherever the report was pasted (the heading may
    carry more, e.g. ``{#id}``), so a page's numbers can be checked against what they claim.
    """
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("# ").startswith(title))
    block = [line.strip() for line in lines[start + 1 : start + 6]]
    compared = next(m for m in map(_COMPARED.match, block) if m)
    figures, verdicts = int(compared[1]), int(compared[2])
    errors = next((m for m in map(_ERRORS.match, block) if m), None)
    agree = next((int(m[1]) for m in map(_AGREE.match, block) if m), 0)
    if errors is None:
        return Summary(figures, verdicts, agree=agree)
    # printed as percent with one decimal: three decimals of the fraction
    median, lowest, highest = (round(float(errors[k]) / 100, 3) for k in (1, 2, 3))
    return Summary(figures, verdicts, median, lowest, highest, int(errors[4]), agree)


TUNING = "Fully specified cases"
HELDOUT = "Held-out cases"


def readme_paragraph(tuning: Summary, heldout: Summary) -> str:
    """The README's paragraph on published GPU runs, from the two sets' summaries."""
    runs = tuning.figures + tuning.verdicts + heldout.figures + heldout.verdicts
    under = tuning.under + heldout.under
    lowest = min(x for x in (tuning.lowest, heldout.lowest) if x is not None)
    verdicts = tuning.verdicts + heldout.verdicts
    agree = tuning.agree + heldout.agree
    under_text = (
        f"none is under by more than 10% (the lowest is {lowest:+.1%})"
        if under == 0
        else f"{under} are under by more than 10% (the lowest is {lowest:+.1%})"
    )
    text = (
        "Against GPU memory that others measured and published (`benchmarks/published.py`: "
        f"{runs} runs torchfit can express, from the Hugging Face guides, Lit-GPT and LitGPT, "
        "torchtune, a ViT tutorial and the Qwen2.5 speed benchmark), the median error is "
        f"{tuning.median:.1%} on the {tuning.figures} figures used for tuning and "
        f"{heldout.median:.1%} on the {heldout.figures} held out (nothing was tuned on "
        f"them); {under_text}, and {agree} of {verdicts} fits / out-of-memory verdicts "
        "agree with what happened."
    )
    return textwrap.fill(text, width=90)


def _section(title: str, rows: list[Row]) -> list[str]:
    """One set of cases: the summary, per source, and the verdicts."""
    lines = [f"## {title}", "", *summarize(rows).lines(), ""]
    by_source: dict[str, list[Row]] = {}
    for row in rows:
        by_source.setdefault(source_of(row.case), []).append(row)
    for source, group in sorted(by_source.items()):
        lines += [f"### {source}", "", *summarize(group).lines(), "", *_table(group), ""]
    verdicts = [row for row in rows if row.verdict is not None]
    if verdicts:
        lines += [
            "### Verdicts",
            "",
            "| case | card | happened | torchfit says |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {row.case.key} | {row.case.gpu} | {row.case.measured} | {row.verdict} "
            f"({_gib(row.predicted)} GiB) |"
            for row in verdicts
        ]
        lines.append("")
    return lines


LONGEST = "Longest sequences (maximum-context tables)"


def report(rows: list[Row], sources: Mapping[str, Source] | None = None) -> str:
    """Markdown: the tuning set, the held-out set, ambiguous cases apart, the longest
    sequences of maximum-context tables, what is not expressible and (given ``sources``)
    what each source's recipe has that torchfit does not model."""
    done = [row for row in rows if not row.reason]
    plain = [row for row in done if not row.case.ambiguous]
    lines = _section(TUNING, [row for row in plain if not row.heldout])
    lines += _section(f"{HELDOUT} (nothing was tuned on them)", [r for r in plain if r.heldout])
    lines += _section("Ambiguous setups (reported apart)", [r for r in done if r.case.ambiguous])
    longest = [
        (row.case.key, str(row.case.gpu), row.case.seq_len or 0, row.longest)
        for row in rows
        if row.longest is not None
    ]
    if longest:
        lines += [f"## {LONGEST}", "", *longest_table(longest), ""]
    skipped = [row for row in rows if row.reason]
    lines += ["## Not expressible yet", "", "| case | why |", "|---|---|"]
    lines += [f"| {row.case.key} | {row.reason} |" for row in skipped]
    noted = {key: s.not_modelled for key, s in (sources or {}).items() if s.not_modelled}
    if noted:
        lines += ["", "## Not modelled, by source (its runs' recipe, not a fudged figure)", ""]
        lines += [f"- `{key}`: {text}" for key, text in sorted(noted.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the comparison as markdown (or, with ``--readme``, the README's paragraph)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--heldout", action="store_true", help="only the held-out cases")
    what.add_argument("--readme", action="store_true", help="the README's paragraph on these runs")
    args = parser.parse_args(argv)
    data = load()
    cases = [(case, True) for case in data.heldout]
    if not args.heldout:
        cases = [(case, False) for case in data.cases] + cases
    rows = [compare(case, heldout=heldout) for case, heldout in cases]
    if args.readme:
        plain = [row for row in rows if not row.reason and not row.case.ambiguous]
        tuning = summarize([row for row in plain if not row.heldout])
        print(readme_paragraph(tuning, summarize([row for row in plain if row.heldout])))
        return
    print(report(rows, data.sources))


if __name__ == "__main__":
    main()
