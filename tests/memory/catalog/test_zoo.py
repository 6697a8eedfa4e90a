"""Vision models by their libraries' names: ``torchvision/<name>`` and ``timm/<name>``.

The libraries are optional, so most tests put a small stand-in module in their place
(`sys.modules`); the last ones build real models when the library is installed.
"""

import functools
import sys
import types

import pytest
import torch
from torch import nn

from torchfit.memory.catalog import build_model, count_parameters, resolve_model, zoo
from torchfit.memory.catalog.zoo import is_zoo_name, zoo_model


def small_net(classes=10):
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, classes))  # fmt: skip


def fake_timm():
    module = types.ModuleType("timm")
    built = []

    def create_model(name, pretrained=False):
        assert not pretrained  # weights are never downloaded
        net = small_net()
        net.pretrained_cfg = {"input_size": (3, 288, 288)}
        built.append(next(net.parameters()).device.type)
        return net

    module.list_models = lambda: ["convnext_tiny", "resnet50", "vit_base_patch16_224"]
    module.create_model = create_model
    module.built = built
    return module


def fake_torchvision():
    module = types.ModuleType("torchvision")
    models = types.ModuleType("torchvision.models")
    weights = types.SimpleNamespace(DEFAULT=types.SimpleNamespace(
        transforms=functools.partial(object, crop_size=[240], resize_size=[256])))  # fmt: skip
    models.list_models = lambda: ["alexnet", "efficientnet_b1", "resnet50"]
    models.get_model = lambda name, weights=None: small_net(1000)
    models.get_model_weights = lambda name: weights
    module.models = models
    return module


@pytest.fixture(autouse=True)
def _fresh_builds():
    zoo._build.cache_clear()
    yield
    zoo._build.cache_clear()


@pytest.fixture
def libraries(monkeypatch):
    timm, torchvision = fake_timm(), fake_torchvision()
    monkeypatch.setitem(sys.modules, "timm", timm)
    monkeypatch.setitem(sys.modules, "torchvision", torchvision)
    return timm, torchvision


def test_zoo_names():
    assert is_zoo_name("timm/convnext_tiny") and is_zoo_name("torchvision/resnet50")
    assert is_zoo_name(" TIMM/resnet50 ")
    assert not is_zoo_name("timm/") and not is_zoo_name("timm/a/b")
    assert not is_zoo_name("facebook/convnext-tiny-224")


def test_timm_models_build_on_meta_with_their_input_size(libraries):
    timm, _ = libraries
    _model, shape = zoo_model("timm/convnext_tiny")
    assert shape == (3, 288, 288)
    assert timm.built == ["meta"]
    resolved = resolve_model("timm/convnext_tiny")
    assert (resolved.source, resolved.config, resolved.input_shape) == ("timm", None, shape)
    assert count_parameters(build_model("timm/convnext_tiny")) == count_parameters(small_net())


def test_torchvision_models_take_the_crop_size_of_their_weights(libraries):
    _, shape = zoo_model("torchvision/efficientnet_b1")
    assert shape == (3, 240, 240)


def test_zoo_models_plan_like_any_model(libraries):
    from torchfit.memory import estimate
    from torchfit.memory.plan import plan_card

    est = estimate("timm/convnext_tiny", batch_size=4, device="cpu")
    assert est.notes[0] == "method: meta-device pass of Sequential"
    assert est.weights == 4 * count_parameters(small_net())
    plan = plan_card("torchvision/resnet50", "RTX 3060", batch_size=8)
    assert plan.step.input_shape == (3, 240, 240)
    assert plan.fits and plan.largest_batch > 8


def test_an_unknown_zoo_model_lists_close_names(libraries):
    with pytest.raises(
        ValueError, match=r"timm has no model 'convnext_tin'; close names: convnext"
    ):
        resolve_model("timm/convnext_tin")


@pytest.mark.parametrize(
    ("name", "extra"), [("timm/resnet50", "timm"), ("torchvision/resnet50", "vision")]
)
def test_a_missing_library_names_its_extra(monkeypatch, name, extra):
    monkeypatch.setitem(sys.modules, name.partition("/")[0], None)  # import now fails
    with pytest.raises(ImportError, match=rf"pip install 'torchfit\[{extra}\]'"):
        resolve_model(name)


def test_zoo_models_build_on_meta_only(libraries):
    with pytest.raises(ValueError, match="meta device only"):
        build_model("timm/resnet50", device="cpu")


def test_real_timm_counts_match_its_tables():
    pytest.importorskip("timm")
    model, shape = zoo_model("timm/convnext_tiny")
    assert count_parameters(model) == 28_589_128
    assert shape == (3, 224, 224)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_real_torchvision_counts_match_its_tables():
    pytest.importorskip("torchvision")
    model, shape = zoo_model("torchvision/alexnet")
    assert count_parameters(model) == 61_100_840
    assert shape == (3, 224, 224)
    assert next(model.parameters()).dtype == torch.float32
