"""The rule table and the machine facts it reads."""

import torch

from torchfit.memory.kernels.cpu import CpuRules, cpu_block, has_rule, workspace_rules
from torchfit.memory.kernels.machine import CpuMachine, cpu_features, onednn_isa, this_cpu

aten = torch.ops.aten


def test_layer_norm_backward_rule_counts_per_thread_partial_sums():
    rules = CpuRules(threads=3, block=16)
    grad = x = torch.empty(4, 10, 48)
    mean = torch.empty(4, 10, 1)
    weight = torch.empty(48)
    args = (grad, x, [48], mean, mean, weight, weight, [True, True, True])
    assert rules(aten.native_layer_norm_backward.default, args, {}, None) == 3 * 2 * 48 * 4
    no_affine = (grad, x, [48], mean, mean, None, None, [True, False, False])
    assert rules(aten.native_layer_norm_backward.default, no_affine, {}, None) == 0


def test_cpu_block_matches_the_isa_onednn_dispatches():
    isa = onednn_isa()  # the CPU's best, capped by ONEDNN_MAX_CPU_ISA
    expected = 16 if isa.startswith("AVX512") else 8 if isa.startswith("AVX2") else 1
    assert cpu_block() == expected


def test_this_cpu_reads_what_torch_reports():
    machine = this_cpu()
    features = cpu_features()
    assert machine.threads == torch.get_num_threads()
    assert machine.block == cpu_block()
    isa = onednn_isa()
    # the flags count where oneDNN may use them (ONEDNN_MAX_CPU_ISA can cap them away)
    assert machine.amx == (isa == "AVX512_CORE_AMX" and bool(features.get("amx_bf16")))
    assert machine.avx512_bf16 == (isa in {"AVX512_CORE_BF16", "AVX512_CORE_AMX"})
    assert not machine.avx512_bf16 or features.get("avx512_bf16")
    assert workspace_rules("cpu") == CpuRules(**vars(machine))


def test_rules_follow_the_thread_count():
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert workspace_rules("cpu").threads == 1
    finally:
        torch.set_num_threads(saved)
    assert workspace_rules("cpu").threads == saved


def test_only_ruled_ops_are_worth_recording_and_cuda_adds_reductions_and_cudnn():
    assert has_rule(aten.convolution_backward.default)
    assert not has_rule(aten.add.Tensor)
    cuda = workspace_rules("cuda")
    big = torch.empty(64, 4096, 64, device="meta")
    assert cuda(aten.add.Tensor, (big, big), {}, None) == 0
    x, w = torch.empty(8, 64, 56, 56, device="meta"), torch.empty(64, 64, 3, 3, device="meta")
    conv = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert cuda(aten.convolution.default, conv, {}, x) == 2 * x.nbytes + w.nbytes  # NHWC copies
    assert cuda(aten.sum.dim_IntList, (big.flatten(0, 1), [0], True), {}, None) > 0
    assert workspace_rules("mps") is None
    assert CpuMachine(threads=2, block=8).pad(9) == 16
