"""Kernel scratch that a dispatch-level tracker cannot see: per-op, per-device rules.

One set of rules serves both estimators: the tracer (`torchfit.memory.trace`) asks them
for every ATen op it runs on fake tensors, the analytic module estimate
(`torchfit.memory.estimate` of an ``nn.Module``) for the calls each layer makes on meta
tensors (`cpu.scratch_of`). The interface is ``rules(func, args, kwargs, out) -> bytes``.

`cpu`: the table of CPU rules; `machine`: what torch and oneDNN report about the CPU
(threads, the ISA oneDNN dispatches to and its kind, channel block, AMX, cache sizes);
`accuracy`: the rules' measured bounds per torch version and kind of CPU; `conv`,
`norms`, `attention`, `embedding`, `matmul`: the rules by kind of op; `onednn`,
`onednn_nhwc`, `onednn_groups`: oneDNN's f32 convolution kernels in detail,
`onednn_scratchpad` its scratchpad bookkeeping;
`onednn_matmul`, `amx_tiles`, `onednn_amx_conv`: its bf16 kernels on AMX; `tensors`:
copies and layouts; `layout`: the CPU kernels' output layouts; `calls`: the calls a model
makes, recorded for the analytic estimate. `cuda`: what a CUDA step does differently
(fused attention, foreach optimizers).
"""
