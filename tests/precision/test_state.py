"""`MixedPrecision.load_state_dict` on what checkpoints really hold: ``None`` (saved
without it), GradScaler's own dict, a dict cut short or edited. Each is refused with the
value, what was expected and the fix, before anything is loaded.
"""

import numpy as np
import pytest
import torch

from torchfit.precision import MixedPrecision


def trained(dtype):
    """A MixedPrecision after two steps (one skipped): counters and a scale to keep."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mp = MixedPrecision(dtype, device="cpu", init_scale=2.0**8)
    for poison in (1.0, float("inf")):
        with mp.autocast():
            loss = net(torch.randn(3, 4)).float().square().mean() * poison
        mp.backward(loss)
        mp.step(opt)
    return mp


def refuses(mp, state, error, message):
    before = mp.state_dict()
    with pytest.raises(error, match=message):
        mp.load_state_dict(state)
    assert mp.state_dict() == before  # nothing loaded


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_none_from_a_checkpoint_saved_without_it_is_refused_with_the_fix(dtype):
    # torch's GradScaler.load_state_dict ignores anything when disabled and fails on len()
    # when enabled; here the counters would be lost either way, so it is an error.
    message = r"got None: .*nothing to restore; .*if state is not None: mp.load_state_dict"
    refuses(trained(dtype), None, TypeError, message)


@pytest.mark.parametrize("value", [[], "mp.pt", torch.zeros(2), 3])
def test_a_state_that_is_not_a_dict_is_refused(value):
    refuses(trained("bf16"), value, TypeError, rf"got a {type(value).__name__}, expected a dict")


def test_a_grad_scaler_state_dict_is_refused_naming_where_it_goes():
    scaler_state = torch.amp.GradScaler("cpu").state_dict()
    refuses(trained("fp16"), scaler_state, ValueError, r"GradScaler state dict.*mp\.scaler\.load")


@pytest.mark.parametrize(
    "key",
    ["precision", "accumulate", "optimizer_steps", "skipped_steps", "scale_history", "scaler"],
)
def test_a_state_with_a_key_missing_is_refused_naming_it(key):
    mp = trained("fp16")
    state = mp.state_dict()
    del state[key]
    refuses(mp, state, ValueError, rf"lacks '{key}': it was cut short or edited")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("optimizer_steps", -1, r"'optimizer_steps' is -1, expected a whole number >= 0"),
        ("optimizer_steps", "2", r"'optimizer_steps' is '2', expected a whole number"),
        ("skipped_steps", None, r"'skipped_steps' is None, expected a whole number"),
        ("skipped_steps", True, r"'skipped_steps' is True, expected a whole number"),
        ("skipped_steps", 1.5, r"'skipped_steps' is 1.5, expected a whole number"),
        ("scale_history", None, r"'scale_history' is None, expected a list of \[update"),
        ("scale_history", [[0]], r"'scale_history' is \[\[0\]\], expected a list"),
        ("scale_history", [[0, "256"]], r"'scale_history' is .*, expected a list"),
        ("scaler", {}, r"'scaler' is \{\}, expected GradScaler.state_dict\(\)"),
        ("scaler", None, r"'scaler' is None, expected GradScaler.state_dict\(\)"),
    ],
)
def test_a_state_with_a_bad_value_is_refused_before_anything_is_loaded(key, value, message):
    mp = trained("fp16")
    refuses(mp, mp.state_dict() | {key: value}, ValueError, message)


def test_a_scaler_state_where_there_is_no_scaler_is_refused():
    mp = trained("bf16")
    state = mp.state_dict() | {"scaler": torch.amp.GradScaler("cpu").state_dict()}
    refuses(mp, state, ValueError, r"expected \{\} \(bf16 and fp32 have no scaler\)")


def test_counters_of_other_integer_types_load():
    # A checkpoint written through NumPy or torch scalars still loads.
    saved = trained("fp16").state_dict()
    steps, skipped = saved["optimizer_steps"], saved["skipped_steps"]
    state = saved | {"optimizer_steps": np.int64(steps), "skipped_steps": torch.tensor(skipped)}
    mp = MixedPrecision("fp16", device="cpu")
    mp.load_state_dict(state)
    assert mp.state_dict() == saved
