"""The rule table and the machine facts it reads."""

import torch

from torchfit.memory.kernels.cpu import CpuRules, cpu_block, has_rule, workspace_rules
from torchfit.memory.kernels.machine import CpuMachine, cpu_features, this_cpu

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


def test_cpu_block_matches_the_capability():
    capability = torch.backends.cpu.get_cpu_capability()
    expected = 16 if capability.startswith("AVX512") else 8 if capability == "AVX2" else 1
    assert cpu_block() == expected


def test_this_cpu_reads_what_torch_reports():
    machine = this_cpu()
    features = cpu_features()
    assert machine.threads == torch.get_num_threads()
    assert machine.block == cpu_block()
    assert machine.amx == bool(features.get("amx_tile") and features.get("amx_bf16"))
    assert machine.avx512_bf16 == bool(features.get("avx512_bf16"))
    assert workspace_rules("cpu") == CpuRules(**vars(machine))


def test_rules_follow_the_thread_count():
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert workspace_rules("cpu").threads == 1
    finally:
        torch.set_num_threads(saved)
    assert workspace_rules("cpu").threads == saved


def test_only_ruled_ops_are_worth_recording_and_cuda_has_none():
    assert has_rule(aten.convolution_backward.default)
    assert not has_rule(aten.add.Tensor)
    assert workspace_rules("cuda") is None
    assert CpuMachine(threads=2, block=8).pad(9) == 16
