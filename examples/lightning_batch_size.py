"""Pick a Lightning batch size by prediction: torchfit's ``BatchSizeFinder`` callback.

Lightning's own ``BatchSizeFinder`` doubles the batch until a step runs out of memory,
then halves (or bisects). torchfit's callback of the same name traces the module's real
step on fake tensors (``training_step``, the optimizer of ``configure_optimizers``, the
trainer's precision), solves the largest batch that fits, runs one real step to check
it, and sets ``batch_size`` where Lightning's finder would (here ``hparams``). On a
CPU, ``simulate_gpu`` plays the card; on CUDA the card itself is the budget.

Before (Lightning's finder: up to 25 trials of 3 steps, each size doubled until OOM)::

    trainer = pl.Trainer(callbacks=[lightning.pytorch.callbacks.BatchSizeFinder()])

After::

    trainer = pl.Trainer(callbacks=[torchfit.integrations.lightning.BatchSizeFinder()])

Run: python examples/lightning_batch_size.py [--smoke]
"""

import argparse
import contextlib
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchfit.integrations.lightning import BatchSizeFinder
from torchfit.memory import simulate_gpu

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()
warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)  # Lightning 2.6 on torch 2.13
warnings.filterwarnings("ignore", ".*does not have many workers")
torch.manual_seed(0)

side, samples = (16, 2048) if args.smoke else (28, 16384)
images = TensorDataset(torch.randn(samples, 1, side, side), torch.randint(0, 10, (samples,)))


class Classifier(pl.LightningModule):
    def __init__(self, batch_size=32, lr=1e-3):  # noqa: ARG002 - read by save_hyperparameters
        super().__init__()
        self.save_hyperparameters()  # hparams.batch_size: where the finder writes
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (side // 4) ** 2, 10),
        )  # fmt: skip
        self.trained = []

    def training_step(self, batch, batch_idx):  # noqa: ARG002 - Lightning's signature
        x, y = batch
        self.trained.append(len(x))
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(images, batch_size=self.hparams.batch_size, shuffle=True)


model = Classifier()
finder = BatchSizeFinder()  # budget: the GPU; on a CPU, the simulated card below
trainer = pl.Trainer(
    max_steps=3 if args.smoke else 50,
    callbacks=[finder],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
card = "32MiB" if args.smoke else "256MiB"
on_cpu = not torch.cuda.is_available()
with simulate_gpu(card, track=model) if on_cpu else contextlib.nullcontext():
    trainer.fit(model)

print(finder.result)
size = model.hparams.batch_size
steps = model.trained[finder.result.real_steps :]  # after the search's real steps
print(f"trained at batch size {size}: {len(steps)} steps, batches {sorted(set(steps))}")
