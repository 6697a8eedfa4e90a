"""Kernel scratch that a dispatch-level tracker cannot see: per-op, per-device rules.

`cpu`: ATen / oneDNN kernels on x86 CPUs (`onednn`, `onednn_groups` hold the convolution
details). `cuda`: what a CUDA step does differently (fused attention, foreach optimizers).
"""
