"""Where users already train: batch sizes chosen by prediction inside Lightning and transformers.

* `torchfit.integrations.lightning.BatchSizeFinder`: a Lightning callback (``pip install
  'torchfit[lightning]'``).
* `torchfit.integrations.transformers.fit_batch_size`: for a transformers ``Trainer``
  before ``train()`` (``pip install 'torchfit[hf]'``).

Both trace the framework's own training step on fake tensors (`torchfit.memory.trace_step`),
solve the largest batch within a budget, verify it with one real step
(`torchfit.memory.find_batch_size`) and set it where training reads it. Importing this
package loads neither framework; each submodule loads its own.
"""

__all__: list[str] = []
