"""Pick a transformers ``Trainer`` batch size by prediction: ``fit_batch_size``.

``TrainingArguments(auto_find_batch_size=True)`` restarts training at 0.9 times the
batch after every out-of-memory error, and never goes above the size it starts at.
``fit_batch_size(trainer)`` traces the Trainer's own step on fake tensors (its data
collator, ``compute_loss``, the optimizer ``optim`` names, fp16/bf16, gradient
checkpointing), solves the largest batch that fits, runs one real step to check it,
and sets ``per_device_train_batch_size`` (and the copy the Trainer made of it). With
``keep_effective_batch=True`` it raises ``gradient_accumulation_steps`` instead of
changing the effective batch. On a CPU, ``simulate_gpu`` plays the card.

Before::

    args = TrainingArguments(..., per_device_train_batch_size=64, auto_find_batch_size=True)
    Trainer(model=model, args=args, ...).train()

After::

    trainer = Trainer(model=model, args=args, ...)
    fit_batch_size(trainer)
    trainer.train()

Run: python examples/hf_trainer_batch_size.py [--smoke]
"""

import argparse
import contextlib
import tempfile

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
    default_data_collator,
)
from transformers.utils import logging

from torchfit.integrations.transformers import fit_batch_size
from torchfit.memory import simulate_gpu

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()
logging.set_verbosity_error()
torch.manual_seed(0)

layers, width, seq = (2, 64, 64) if args.smoke else (4, 256, 256)
config = GPT2Config(
    n_layer=layers, n_embd=width, n_head=4, vocab_size=1024, n_positions=seq,
    bos_token_id=0, eos_token_id=0,
)  # fmt: skip
model = GPT2LMHeadModel(config)
rows = torch.randint(0, 1024, (2048, seq))
dataset = [{"input_ids": row, "labels": row} for row in rows]  # packed language modelling

trained = []


def count(_module, _args, kwargs):
    if type(kwargs["input_ids"]) is torch.Tensor:  # real batches, not the trace's fake ones
        trained.append(kwargs["input_ids"].shape[0])


model.register_forward_pre_hook(count, with_kwargs=True)
output = tempfile.mkdtemp()
training = TrainingArguments(
    output,
    per_device_train_batch_size=64,
    gradient_accumulation_steps=2,  # an effective batch of 128 per device
    max_steps=2 if args.smoke else 20,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
)
trainer = Trainer(
    model=model, args=training, train_dataset=dataset, data_collator=default_data_collator
)

card = "48MiB" if args.smoke else "1GiB"
on_cpu = not torch.cuda.is_available()
with simulate_gpu(card, track=model) if on_cpu else contextlib.nullcontext():
    result = fit_batch_size(trainer, keep_effective_batch=True)
    searched = len(trained)
    trainer.train()

print(result)
print(
    f"per_device_train_batch_size={training.per_device_train_batch_size}, "
    f"gradient_accumulation_steps={training.gradient_accumulation_steps} "
    f"(effective {training.per_device_train_batch_size * training.gradient_accumulation_steps})"
)
steps = trained[searched:]
print(f"trained {len(steps)} micro-batches at batch size {sorted(set(steps))}")
