"""host_fits, the example machines, offloaded state, and RSS readings."""

import pytest
import torch

import torchfit
from torchfit.host import (
    EXAMPLE_MACHINES,
    HostVerdict,
    Machine,
    SampleCost,
    host_fits,
    kv_offload_bytes,
    load_memory,
    machine,
    measure_rss,
    optimizer_offload_bytes,
    read_rss,
    this_machine,
    worker_memory,
)
from torchfit.host.plan import CUDA_BASELINE_BYTES, CUDA_LOAD_RESIDUE_BYTES, IMPORT_BASELINE_BYTES
from torchfit.host.rss import private_bytes
from torchfit.memory import MemoryEstimate

GiB = 2**30


def test_llama_8b_in_bf16_on_the_desktop_streams_through_the_page_cache():
    plan = torchfit.host_fits("llama-3.1-8b", "desktop-3060", dtype="bf16")
    assert plan.load.method == "from_pretrained(dtype=bf16, device_map='cuda')"
    assert 14.9 * GiB < plan.load.file_at_peak < 15.0 * GiB  # every page read on the way
    assert plan.load_must_fit < 2 * GiB
    assert plan.verdict is HostVerdict.PAGES
    assert plan.baseline == CUDA_BASELINE_BYTES + CUDA_LOAD_RESIDUE_BYTES


def test_llama_8b_fits_the_workstation_in_bf16_and_in_4_bit():
    for options in ({"dtype": "bf16"}, {"bits": 4}):
        plan = host_fits("llama-3.1-8b", "workstation-a100", **options)
        assert plan.verdict is HostVerdict.FITS
        assert plan.load_peak < 20 * GiB


def test_llama_8b_on_the_cpu_of_the_desktop_does_not_fit_in_bf16_but_does_in_4_bit():
    bf16 = host_fits("llama-3.1-8b", "desktop-3060", dtype="bf16", device_map="cpu")
    four = host_fits("llama-3.1-8b", "desktop-3060", bits=4, device_map="cpu")
    assert bf16.verdict is HostVerdict.NO
    assert "running needs" in bf16.reasons[0]
    assert bf16.steady > 15 * GiB  # every weight is read at every step
    assert four.verdict is not HostVerdict.NO
    assert four.steady < 8 * GiB  # stale checkpoint pages do not count


def test_the_plan_adds_workers_offloaded_state_and_the_feed():
    workers = worker_memory(torch.utils.data.TensorDataset(torch.zeros(4)), num_workers=4,
                            batch_size=2)  # fmt: skip
    plan = host_fits(
        "gpt2", "desktop-3060", workers=workers, offloaded=GiB,
        cost=SampleCost(0.01, 0.01), batch_size=64, step_seconds=0.05,
    )  # fmt: skip
    bare = host_fits("gpt2", "desktop-3060")
    assert plan.steady == bare.steady + workers.total + GiB
    assert plan.feed is not None and plan.feed.bound.value == "cpu"
    assert any("cpu bounds the pace" in reason for reason in plan.reasons)
    text = str(plan)
    for words in ("peak while loading", "while running", "verdict", "bound by"):
        assert words in text
    data = plan.to_dict()
    assert data["verdict"] == str(plan.verdict)
    assert data["steady"] == plan.steady
    assert data["feed"]["bound"] == "cpu"


def test_a_cpu_machine_gets_the_cpu_baseline():
    box = Machine("box", 8 * GiB, 4)
    plan = host_fits("gpt2", box)
    assert plan.baseline == IMPORT_BASELINE_BYTES
    assert plan.load.on_device == 0


def test_cost_without_a_step_time_is_refused():
    with pytest.raises(ValueError, match="cost needs batch_size and step_seconds"):
        host_fits("gpt2", "desktop-3060", cost=SampleCost(0.01, 0.01))


def test_example_machines_and_errors():
    assert set(EXAMPLE_MACHINES) == {"desktop-3060", "workstation-a100"}
    assert machine(" Desktop-3060 ").ram == 16 * 10**9
    with pytest.raises(ValueError, match="unknown machine"):
        machine("laptop")
    with pytest.raises(ValueError, match="ram"):
        Machine("x", 0, 4)
    here = this_machine()
    assert here.cores >= 1 and here.ram > GiB
    assert "RAM" in str(here)


def test_optimizer_offload_per_node():
    est = MemoryEstimate(weights=2 * 10**9, gradients=2 * 10**9, optimizer=12 * 10**9)
    one = optimizer_offload_bytes(est, trainable_params=10**9)
    assert one == 16 * 10**9  # AdamW state with fp32 masters, plus an fp32 gradient
    two_nodes = optimizer_offload_bytes(est, trainable_params=10**9, world_size=8,
                                        ranks_per_node=4)  # fmt: skip
    assert two_nodes == one // 2
    params = optimizer_offload_bytes(est, trainable_params=10**9, offload_params=True)
    assert params == one + 4 * 10**9


def test_kv_offload_rounds_each_tensor_to_a_power_of_two():
    exact = kv_offload_bytes(batch_size=1, seq_len=1000, num_layers=2, num_kv_heads=1,
                             head_dim=64, dtype="bf16")  # fmt: skip
    assert exact == 2 * 2 * 131072  # 128,000 bytes per tensor -> 128 KiB
    resident = kv_offload_bytes(batch_size=1, seq_len=1000, num_layers=2, num_kv_heads=1,
                                head_dim=64, resident_layers=1)  # fmt: skip
    assert resident == exact // 2
    with pytest.raises(ValueError, match="seq_len"):
        kv_offload_bytes(batch_size=1, seq_len=0, num_layers=2, num_kv_heads=1, head_dim=64)


def _written_pages(nbytes):
    """Fresh anonymous pages, written: glibc cannot serve them from memory it holds."""
    import mmap

    pages = mmap.mmap(-1, nbytes)
    for offset in range(0, nbytes, mmap.PAGESIZE):
        pages[offset] = 1
    pages.close()  # the peak (VmHWM) keeps them


def test_measure_rss_sees_written_pages():
    # torch.ones here could reuse heap memory an earlier test left resident (CI saw +0)
    measured = measure_rss(_written_pages, 32 * 2**20)  # 32 MiB
    assert 31 * 2**20 <= measured.peak <= 40 * 2**20
    assert measured.exact_peak
    assert "RSS" in str(measured)
    assert measured.to_dict()["peak"] == measured.peak


def test_read_rss_and_private_bytes():
    sample = read_rss()
    assert sample.rss == pytest.approx(sample.anon + sample.file + sample.shmem, rel=0.05)
    uss, pss, dirty = private_bytes()
    assert 0 < dirty <= uss <= pss <= sample.rss * 1.05


def test_load_memory_tables_read_well():
    text = str(load_memory("gpt2", dtype="bf16"))
    assert "peak RSS of the load" in text
    assert "anonymous (must fit)" in text
