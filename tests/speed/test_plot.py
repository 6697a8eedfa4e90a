"""The comparison's picture: the table's own numbers, drawn."""

import pytest

from torchfit.cli import main
from torchfit.speed import compare_gpus

matplotlib = pytest.importorskip("matplotlib")
transformers = pytest.importorskip("transformers")
TINY = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)


def _bars(ax, labels_from):
    """Each bar's width by its card (a panel sharing the y axis shows no labels itself)."""
    names = [label.get_text() for label in labels_from.get_yticklabels()]
    return {name: bar.get_width() for name, bar in zip(names, ax.patches, strict=True)}


def test_the_bars_are_the_tables_throughput_and_cost():
    table = compare_gpus(
        TINY, ["H100", "L4"], batch_size=8, seq_len=128, tokens=1e9, price_per_hour={"H100": 2.5}
    )
    figure = table.plot()
    speed, cost = figure.axes
    rows = {row.gpu: row for row in table.rows}
    assert _bars(speed, speed) == {gpu: row.time.tokens_per_s for gpu, row in rows.items()}
    assert _bars(cost, speed) == {gpu: row.cost or 0.0 for gpu, row in rows.items()}
    texts = [t.get_text() for t in cost.texts]
    assert "  no price" in texts  # the L4 has no price: no cost drawn, and it says so
    assert "batch 8 on every card" in figure.texts[0].get_text()


def test_one_panel_without_a_budget_and_a_card_that_cannot_hold_the_step_says_so():
    table = compare_gpus("llama-2-13b", ["H100", "RTX 3060"], seq_len=2048, precision="bf16-true")
    figure = table.plot()
    assert len(figure.axes) == 1
    assert any("does not fit" in t.get_text() for t in figure.axes[0].texts)
    assert "largest batch" in figure.texts[0].get_text()


def test_the_command_line_writes_the_comparisons_picture(tmp_path, capsys):
    out = tmp_path / "cards.png"
    argv = ["plan", "gpt2", "--gpu", "H100", "--gpu", "L4", "--seq", "256", "--plot", str(out)]
    assert main(argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {out}" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.out.lstrip().startswith("{") and f"plot: {out}" in captured.err
