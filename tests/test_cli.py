import json
import os
import subprocess
import sys
import time

import pytest

from torchfit.cli import main


def test_plan_prints_breakdown_verdict_batch_and_advice(capsys):
    assert main(["plan", "gpt2", "--gpu", "RTX 3060"]) == 0
    out = capsys.readouterr().out
    for needle in ("weights", "verdict", "largest batch", "advice", "RTX 3060"):
        assert needle in out


def test_plan_json(capsys):
    assert (
        main(
            [
                "plan",
                "gpt2",
                "--gpu",
                "A100 40GB",
                "--inference",
                "--dtype",
                "int8",
                "--seq",
                "256",
                "--batch",
                "4",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    step = data["settings"]["step"]
    assert (step["mode"], step["batch_size"], step["seq_len"]) == ("inference", 4, 256)
    assert step["quantization"] == "int8"
    assert data["fits"] is True


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "gtp2", "--gpu", "RTX 3060"], "gpt2"),
        (["plan", "gpt2", "--gpu", "RTX 9999"], "GPU.custom"),
        (["plan", "gpt2", "--gpu", "A100"], "ambiguous"),
        (["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "99999"], "beyond"),
        (["plan", "gpt2", "--gpu", "RTX 3060", "--device-map"], "add --inference"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfit: error:")
    assert needle in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_gpus_and_models_list(capsys):
    assert main(["gpus"]) == 0
    assert "RTX 3060" in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert {"gpt2", "llama-2-7b", "resnet-50"} <= names


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    assert main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "256", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "torchfit.cli", "plan", "gpt2", "--gpu", "RTX 3060", "--seq", "128"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "verdict" in result.stdout


def test_plan_trace_adds_the_traced_step(capsys):
    assert (
        main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "64", "--batch", "2", "--trace"]) == 0
    )
    captured = capsys.readouterr()
    assert "traced (the real step on fake tensors" in captured.out
    assert "reserved replayed exactly" in captured.out
    assert "tracing:" in captured.err  # the progress bar (tqdm, on stderr)


def test_plan_trace_follows_the_loop_and_precision_it_plans(capsys):
    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "64", "--batch", "2", "--trace"]
    loop = ["--accumulate", "2", "--keep-output", "--fp32-output", "--precision", "bf16-true"]
    assert main([*argv, *loop]) == 0
    out = capsys.readouterr().out.split("traced (the real step")[1]
    assert "2 x (forward, loss, backward)" in out
    assert "the output cast to fp32 before the loss" in out
    assert "the output kept through backward" in out
    assert "the model in torch.bfloat16 (bf16-true)" in out
    assert main([*argv, "--optimizer-in-backward"]) == 0
    assert "stepped per parameter in backward" in capsys.readouterr().out


def test_plan_trace_keeps_what_the_runs_torch_keeps(tmp_path, capsys):
    # before torch 2.2 every RMSNorm's square is kept too: the trace follows the flag
    from tiny_configs import tiny_llama

    tiny_llama().save_pretrained(tmp_path)
    argv = ["plan", str(tmp_path), "--gpu", "RTX 3060", "--seq", "512", "--batch", "4"]
    totals = []
    for version in ("2.13.0", "2.1.0"):
        assert main([*argv, "--trace", "--json", "--torch-version", version]) == 0
        found = json.loads(capsys.readouterr().out)
        totals.append((found["traced"]["total"], found["estimate"]["total"]))
    (new_traced, new_closed), (old_traced, old_closed) = totals
    squares = 4 * 512 * (2 * 2 + 1) * 128 * 4  # tokens x (2 norms x 2 layers + final) x fp32
    assert old_traced - new_traced == squares
    assert old_closed - new_closed == squares


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--lora-rank", "8"], "--lora-rank"), (["--loss-chunk", "16"], "--loss-chunk")],
)
def test_plan_trace_refuses_what_it_cannot_follow(flags, named, capsys):
    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "64", "--batch", "2", "--trace"]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert "cannot follow" in err and named in err


def test_plan_device_map_places_layers_on_each_card(capsys):
    argv = ["plan", "llama-2-13b", "--gpu", "A100 40GB", "--gpus", "2", "--inference"]
    argv += ["--batch", "8", "--seq", "4096", "--device-map"]
    assert main([*argv, "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)["device_map"]
    layers = [layer for share in placed["devices"] for layer in share["layers"]]
    assert layers == list(range(40))  # every decoder layer once, in order
    assert all(share["device_total"] <= share["memory"] for share in placed["devices"])
    assert main(argv) == 0
    assert "verdict: FITS on 2 of 2 GPUs" in capsys.readouterr().out


def test_plan_sharding_flags_reach_the_plan(capsys):
    argv = ["plan", "llama-2-13b", "--gpu", "A100 40GB", "--gpus", "8", "--strategy", "fsdp"]
    argv += ["--offload-optimizer", "--param-dtype", "bf16", "--seq", "2048", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["offload_optimizer"] is True
    assert data["settings"]["param_dtype"] == "bf16"
    assert data["estimate"]["optimizer"] == 0


def test_plan_a_vision_model_from_the_catalog_uses_its_image(capsys):
    argv = ["plan", "resnet-18", "--gpu", "GTX 1060 6GB", "--batch", "32", "--json"]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["settings"]["step"]["input_shape"] == [3, 224, 224]
    assert default["settings"]["step"]["seq_len"] is None
    assert main([*argv, "--input-shape", "3,448,448"]) == 0
    larger = json.loads(capsys.readouterr().out)
    assert larger["settings"]["step"]["input_shape"] == [3, 448, 448]
    # four times the pixels: about four times the activations
    ratio = larger["estimate"]["activations"] / default["estimate"]["activations"]
    assert 3.5 < ratio < 4.5
    assert larger["largest_batch"] < default["largest_batch"]


# --- models by the names people use (issue 15) --------------------------------------------


def test_models_lists_hub_ids_and_search_filters(capsys):
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    assert "meta-llama/Llama-3.1-8B" in listed
    assert len(listed.splitlines()) >= 60
    assert main(["models", "--search", "llama", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {row["name"] for row in rows}
    assert {"llama-3.1-8b", "tinyllama-1.1b", "smollm2-135m"} <= names
    assert "mistral-7b" not in names
    hub = {row["name"]: row["hub_id"] for row in rows}
    assert hub["llama-3.2-1b"] == "meta-llama/Llama-3.2-1B"
    assert main(["models", "--search", "zzqq"]) == 2
    assert "no catalog model matches 'zzqq'" in capsys.readouterr().err


def test_plan_takes_a_hub_id_offline(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["plan", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4090", "--seq", "2048", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["model"] == "meta-llama/Llama-3.1-8B"
    assert data["estimate"]["notes"][0] == "method: closed form for model_type 'llama'"
    # 8,030,261,248 parameters: fp32 master weights under bf16 mixed precision
    assert data["estimate"]["weights"] == 4 * 8_030_261_248


def test_plan_an_architecture_without_closed_form_says_so(capsys):
    assert main(["plan", "t5-small", "--gpu", "RTX 3060", "--seq", "128", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "note: method: the step of T5ForConditionalGeneration built from its config" in out
    assert "verdict: FITS" in out


def test_an_unknown_hub_id_offline_is_one_line_exit_2_in_seconds(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "torchfit.cli", "plan", "acme/no-such-model", "--gpu", "RTX 3060"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    elapsed = time.perf_counter() - start
    assert result.returncode == 2
    assert result.stderr.startswith("torchfit: error: loading 'acme/no-such-model'")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert elapsed < 20  # interpreter and imports included; no network retry loop


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "", "--gpu", "RTX 3060"], "empty model name"),
        (["plan", "timm/resnet50", "--gpu", "RTX 3060"], "pip install 'torchfit[timm]'"),
        (["plan", "./no/such/folder", "--gpu", "RTX 3060"], "no config.json at"),
    ],
)
def test_bad_model_names_are_one_line_and_exit_2(argv, needle, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfit: error:") and needle in err
    assert err.count("\n") == 1


def test_trust_remote_code_is_asked_for_and_says_what_it_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "acme_newarch"}))
    assert main(["plan", str(folder), "--gpu", "RTX 3060"]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    # with the flag, the repository's code is asked for (there is none here): still one line
    assert main(["plan", str(folder), "--gpu", "RTX 3060", "--trust-remote-code"]) == 2
    err = capsys.readouterr().err
    assert "may run its repository's Python code" in err
    assert err.splitlines()[-1].startswith("torchfit: error:")


def test_plan_a_4bit_base_quantized_from_fp16_counts_both_copies(capsys):
    argv = ["plan", "llama-2-7b", "--gpu", "RTX 3060", "--seq", "512", "--dtype", "nf4"]
    assert main([*argv, "--precision", "bf16-true", "--base-dtype", "fp16"]) == 0
    out = capsys.readouterr().out
    # down_proj (11008 x 4096) dequantized to fp16, then copied to bf16
    assert f"(to fp16, then a bf16 copy): {11008 * 4096 * 4:,} bytes" in out


def _plan_options():
    from torchfit.cli.app import _parser

    subparsers = next(a for a in _parser()._actions if a.dest == "command")
    return [a for a in subparsers.choices["plan"]._actions if a.option_strings]


@pytest.mark.parametrize("action", _plan_options(), ids=lambda a: a.option_strings[-1])
def test_every_plan_option_says_what_it_does(action):
    assert action.help and action.help.strip(), f"{action.option_strings} has no help text"


SEQ_LINE = (
    "no --seq given: planning the model's maximum, 40960 tokens; pass --seq N to plan N tokens"
)


def test_a_plan_without_seq_says_it_plans_the_models_maximum_first(capsys):
    assert main(["plan", "Qwen/Qwen3-8B", "--gpu", "H100"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [SEQ_LINE]
    first = captured.out.splitlines()[0]
    assert first.startswith("Qwen/Qwen3-8B, train, bf16-mixed, batch 1, seq 40960, ")
    assert "verdict: DOES NOT FIT" in captured.out
    # stdout stays the plan alone: with --json, one JSON document
    assert main(["plan", "Qwen/Qwen3-8B", "--gpu", "H100", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["settings"]["step"]["seq_len"] == 40960
    assert captured.err.splitlines() == [SEQ_LINE]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "Qwen/Qwen3-8B", "--gpu", "H100", "--seq", "4096"],
        ["plan", "alexnet", "--gpu", "RTX 3060"],  # an image model: no sequence at all
    ],
)
def test_no_seq_line_when_the_sequence_was_given_or_there_is_none(argv, capsys):
    assert main(argv) == 0
    assert capsys.readouterr().err == ""


def test_a_config_without_a_maximum_says_what_it_plans(capsys):
    from transformers import T5Config

    from torchfit.memory.plan.settings import default_sequence

    assert default_sequence(T5Config()) == (
        512,
        "the length T5 was pre-trained with (its config sets no maximum)",
    )


# --- the whole machine: --machine adds the host's RAM and one verdict -----------------------


def test_machine_adds_the_host_plan_and_a_verdict_for_the_whole_machine(capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "RTX 3060", "--inference", "--dtype", "nf4",
            "--seq", "1024", "--machine", "desktop-3060"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Host plan: llama-3.1-8b on desktop-3060" in out
    assert "from_pretrained(4-bit, device_map='cuda')" in out  # loaded as the step holds it
    assert out.rstrip().splitlines()[-1].startswith("machine verdict: FITS (the card: fits;")
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["machine_fits"] is True and data["host"]["machine"]["name"] == "desktop-3060"
    # a bf16 model whose weights alone outgrow the card: the machine does not hold the run
    assert main([*argv[:6], "bf16", *argv[7:], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is False and data["machine_fits"] is False
    assert "dtype=bf16" in data["host"]["load"]["method"]


# --- several --gpu: one table, the fastest and the cheapest card ----------------------------


def test_several_gpus_compare_the_cards_and_name_the_fastest_and_cheapest(capsys):
    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--gpu", "H100", "--seq", "512",
            "--tokens", "1e8", "--price", "RTX 3060=0.2", "--price", "H100=2.5"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("  NVIDIA")]
    assert len(rows) == 2 and "RTX 3060" in rows[0] and "H100" in rows[1]  # in the order given
    assert out[-2].startswith("fastest: NVIDIA H100")
    assert out[-1].startswith("cheapest for 1e+08 tokens: ")
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_card = {row["gpu"]: row for row in data["rows"]}
    # each card's largest batch is the one a single-card plan finds
    assert main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "512", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert by_card["NVIDIA GeForce RTX 3060 12GB"]["largest_batch"] == single["largest_batch"]
    cheapest = min(data["rows"], key=lambda row: row["cost"])["gpu"]
    assert out[-1].split(": ")[1].startswith(cheapest)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--strategy", "fsdp"], "--strategy"),
        (["--trainable-params", "1000"], "--trainable-params"),
        (["--machine", "desktop-3060"], "--machine"),
        (["--price", "A100=1.0"], "--price"),
    ],
)
def test_a_comparison_refuses_what_it_cannot_time(extra, named, capsys):
    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--gpu", "H100", "--seq", "128", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfit: error: ") and named in err


def test_a_comparison_plans_memory_only_flags_and_times_the_step(capsys):
    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--gpu", "H100", "--seq", "512", "--json"]
    assert main(argv) == 0
    plain = {row["gpu"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert main([*argv, "--loss-chunk", "64"]) == 0  # no whole logits tensor
    chunked = {row["gpu"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    card = "NVIDIA GeForce RTX 3060 12GB"
    assert chunked[card]["largest_batch"] > plain[card]["largest_batch"]


def test_plan_time_adds_the_planned_steps_time_on_the_card(capsys):
    from torchfit import fits
    from torchfit.speed import step_time

    argv = ["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "256", "--batch", "2", "--time"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    expected = step_time(
        "gpt2", "RTX 3060", fits("gpt2", "RTX 3060", batch_size=2, seq_len=256).step
    )
    assert "\nstep time (predicted, the planned step on this card):\n" in out
    assert f"{expected.seconds * 1e3:,.1f} ms per step" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["time"]["seconds"] == pytest.approx(expected.seconds)
    assert main(["plan", "gpt2", "--gpu", "RTX 3060", "--seq", "256", "--json"]) == 0
    assert "time" not in json.loads(capsys.readouterr().out)


def test_plan_time_over_several_cards_adds_their_collectives(capsys):
    argv = ["plan", "gpt2", "--gpu", "H100", "--gpus", "2", "--strategy", "ddp", "--time"]
    assert main([*argv, "--seq", "256"]) == 0
    out = capsys.readouterr().out
    assert "gpt2 on 2 x NVIDIA H100 SXM:" in out
    assert "2 GPUs over NVLink 4 + NVSwitch" in out and "DDP: the gradients all-reduced" in out
