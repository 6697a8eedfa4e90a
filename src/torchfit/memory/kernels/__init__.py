"""Kernel scratch that a dispatch-level tracker cannot see: per-op, per-device rules.

One set of rules serves both estimators: the tracer (`torchfit.memory.trace`) asks them
for every ATen op it runs on fake tensors, the analytic module estimate
(`torchfit.memory.estimate` of an ``nn.Module``) for the calls each layer makes on meta
tensors (`cpu.scratch_of`). The interface is ``rules(func, args, kwargs, out) -> bytes``.

`cpu`: the table of CPU rules; `machine`: what torch reports about the CPU; `conv`,
`norms`, `attention`, `embedding`, `matmul`: the rules by kind of op; `onednn`,
`onednn_nhwc`, `onednn_groups`, `onednn_scratchpad`: oneDNN's convolution kernels in
detail; `tensors`: copies and layouts. `cuda`: what a CUDA step does differently (fused
attention, foreach optimizers).
"""
