"""The plan's picture states its answer, agrees with its verdict, and the CLI says where it is."""

import json

import pytest

import torchfit
from torchfit.cli import main
from torchfit.memory.plan.plot import (
    YLABEL,
    batch_sizes,
    device_needs,
    draw_plan,
    plot_path,
    plot_plan,
)

plt = pytest.importorskip("matplotlib.pyplot")

GiB = 2**30


@pytest.mark.parametrize(
    ("model", "gpu", "kwargs"),
    [
        ("gpt2", "RTX 3060", {"seq_len": 512}),
        ("llama-2-7b", "RTX 4090", {"dtype": "nf4", "gradient_checkpointing": True}),
        ("llama-2-13b", ["A100 40GB"] * 8, {"strategy": "fsdp", "seq_len": 2048}),
    ],
)
def test_the_points_are_the_estimates_the_verdict_uses(model, gpu, kwargs):
    plan = torchfit.fits(model, gpu, **kwargs)
    at_plan, at_largest, past = device_needs(
        model,
        plan,
        [plan.step.batch_size, max(plan.largest_batch, 1), plan.largest_batch + 1],
    )
    assert at_plan == plan.estimate.device_needed
    assert (at_largest <= plan.budget) == (plan.largest_batch > 0)
    assert past > plan.budget


def test_batch_sizes_reach_past_the_largest_batch():
    for largest in (0, 1, 5, 124, 1000):
        sizes = batch_sizes(largest)
        assert sizes == sorted(set(sizes))
        assert sizes[0] == 1
        if largest:
            assert {largest, largest + 1} <= set(sizes)
            assert sizes[-1] >= 2 * largest


def _drawn(model, gpu, **kwargs):
    plan = torchfit.fits(model, gpu, **kwargs)
    figure = draw_plan(model, plan)
    axes = figure.axes[0]
    texts = [text.get_text() for text in axes.texts]
    plt.close(figure)
    return plan, axes, texts


def test_the_picture_states_the_answer():
    plan, axes, texts = _drawn("llama-2-7b", "RTX 4090", dtype="nf4", gradient_checkpointing=True)
    assert axes.get_ylabel() == YLABEL == "device memory needed (OOM line + CUDA context), GiB"
    bottom, top = axes.get_ylim()
    assert bottom == 0
    assert "NVIDIA GeForce RTX 4090 (24.00 GiB)" in axes.get_title()
    used = plan.largest_batch
    assert used > 0
    assert any(
        t.startswith(f"largest batch {used}: ") and t.endswith(" of 24.00 GiB") for t in texts
    )
    # the region above the card is shaded: a patch from the card's GiB to the top
    shaded = [p for p in axes.patches if p.get_y() == pytest.approx(24.0)]
    assert len(shaded) == 1
    assert shaded[0].get_height() == pytest.approx(top - 24.0)
    assert "does not fit " in texts


def test_a_plan_where_nothing_fits_marks_batch_one():
    plan, _, texts = _drawn("llama-2-7b", "RTX 4090", dtype="nf4")
    assert plan.largest_batch == 0
    gib = plan.estimate.device_needed / GiB
    assert f"batch 1 does not fit: {gib:.2f} of 24.00 GiB" in texts


def test_the_cli_says_where_it_wrote_the_plot(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "256", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith(f"plot: {out} ")
    # with --json, stdout stays one JSON document; the path goes to stderr
    assert (
        main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "256", "--json", "--plot", str(out)])
        == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out)["gpu"] == "NVIDIA GeForce RTX 3060 12GB"
    assert captured.err.startswith(f"plot: {out} ")


@pytest.mark.parametrize(
    "name", ["", " ", "\t", ".png", " .png", "\t.png", " plan.png", "a\nb.png"]
)
def test_a_blank_or_unportable_name_is_refused_before_drawing(name, tmp_path, monkeypatch):
    # matplotlib adds ".png" to a name without a suffix: "" " " and a tab once wrote the
    # files ".png", " .png" and "\t.png" into the repository's root
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="expected a file to write in an existing folder"):
        plot_path(name)
    plan = torchfit.fits("gpt2", "RTX 3060", seq_len=128)
    with pytest.raises(ValueError, match=r"e\.g\. plan\.png"):
        plot_plan("gpt2", plan, name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", [".", "no/such/folder/plan.png"])
def test_a_folder_or_a_missing_folder_is_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="existing folder"):
        plot_path(name)


def test_the_picture_is_written_at_the_path_given_suffix_or_not(tmp_path):
    plan = torchfit.fits("gpt2", "RTX 3060", seq_len=128)
    plot_plan("gpt2", plan, tmp_path / "plan")
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]  # not plan.png
    assert (tmp_path / "plan").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
