"""hookscope.load_images: image files made into a model's input by the model library's own transform
(torchvision's weights.transforms(), timm's resolve_data_config + create_transform, transformers'
AutoImageProcessor), the same tensors through the command line's --image."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hookscope
from hookscope.cli import main
from hookscope.cli.inputs._images import load_images as cli_load_images

PIL = pytest.importorskip("PIL.Image")


def _files(tmp_path: Path) -> list[str]:
    """A PNG and a JPEG of odd sizes and random pixels (the JPEG as its decoder reads it back)."""
    rng = np.random.default_rng(0)
    png, jpg = tmp_path / "a.png", tmp_path / "b.jpg"
    PIL.fromarray(rng.integers(0, 256, (150, 210, 3), dtype=np.uint8)).save(png)
    PIL.fromarray(rng.integers(0, 256, (260, 190, 3), dtype=np.uint8)).save(jpg, quality=90)
    return [str(png), str(jpg)]


def _rgb(path: str) -> object:
    with PIL.open(path) as im:
        return im.convert("RGB")


def _cli(spec: str, files: list[str], **given: object) -> hookscope.Images:
    args = argparse.Namespace(image=files, size=None, preset="auto", model=spec, weights=None, config=None)
    for k, v in given.items():
        setattr(args, k, v)
    return cli_load_images(args)


@pytest.mark.parametrize(("model", "name"), [
    ("resnet18", "ResNet18_Weights.IMAGENET1K_V1"),  # resize 256, crop 224, bilinear
    ("efficientnet_b0", "EfficientNet_B0_Weights.IMAGENET1K_V1"),  # resize 256, crop 224, bicubic
    ("inception_v3", "Inception_V3_Weights.IMAGENET1K_V1"),  # resize 342, crop 299
])
def test_torchvision_images_are_the_weights_own_transforms(tmp_path: Path, model: str, name: str) -> None:
    tv = pytest.importorskip("torchvision")
    files = _files(tmp_path)
    weights = tv.models.get_weight(name)
    # torchvision's transforms take the picture as a float tensor in [0, 1] (their tensor input)
    expected = torch.stack([weights.transforms()(tv.transforms.functional.to_tensor(_rgb(f))) for f in files])
    batch = hookscope.load_images(f"torchvision:{model}", files, weights=name.split(".")[-1])
    assert batch.transform.library == "torchvision" and batch.transform.name == name
    assert torch.equal(batch.x, expected)
    assert batch.names == ["a.png", "b.jpg"] and batch.paths == files
    assert torch.equal(_cli(f"torchvision:{model}", files, weights=name.split(".")[-1]).x, expected)
    # the pictures for drawing are the same input without the normalisation, in [0, 1]
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (weights.transforms().mean, weights.transforms().std))
    assert torch.allclose(batch.pictures, (expected * std + mean).clamp(0, 1), atol=1e-6)
    # the model itself: built with weights=None, its input is still the weights' transform
    net = getattr(tv.models, model)(weights=None, **({"aux_logits": False, "init_weights": False}
                                                     if model == "inception_v3" else {})).eval()
    with torch.no_grad():
        assert torch.equal(net(batch.x), net(expected))


@pytest.mark.parametrize("name", ["resnet10t", "vit_tiny_patch16_224"])
def test_timm_images_are_timms_own_eval_transform(tmp_path: Path, name: str) -> None:
    timm = pytest.importorskip("timm")
    from timm.data import create_transform, resolve_data_config

    files = _files(tmp_path)
    net = timm.create_model(name, pretrained=False).eval()
    own = create_transform(**resolve_data_config({}, model=net))  # timm's eval transform of a PIL image
    expected = torch.stack([own(_rgb(f)) for f in files])
    batch = hookscope.load_images(f"timm:{name}", files)
    assert batch.transform.library == "timm" and tuple(batch.x.shape[-2:]) == net.pretrained_cfg["input_size"][1:]
    assert torch.equal(batch.x, expected)
    assert torch.equal(_cli(f"timm:{name}", files).x, expected)
    assert hookscope.example_input(f"timm:{name}").shape[1:] == torch.Size(net.pretrained_cfg["input_size"])


def _hf_folder(tmp_path: Path, processor: str) -> str:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"
    transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, num_labels=3).save_pretrained(folder)
    if processor == "vit":  # a plain resize to 32 x 32, bicubic, its own mean and std
        made = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, resample=3,
                                              image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3])
    else:  # the shorter side to 40, then the centre 32 x 32 (CLIP's way)
        made = transformers.CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32})
    made.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("processor", ["vit", "clip"])
def test_hf_images_are_the_folders_own_image_processor(tmp_path: Path, processor: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    folder, files = _hf_folder(tmp_path, processor), _files(tmp_path)
    own = transformers.AutoImageProcessor.from_pretrained(folder)
    expected = own(images=[_rgb(f) for f in files], return_tensors="pt")["pixel_values"]
    batch = hookscope.load_images("hf:image-classification", files, config=folder)
    assert batch.transform.library == "transformers" and batch.transform.size == (32, 32)
    assert batch.x.shape == (2, 3, 32, 32) and torch.equal(batch.x, expected)
    assert torch.equal(_cli("hf:image-classification", files, config=folder).x, expected)
    # the command runs the model on the same tensor
    assert main(["cam", "hf:image-classification", "--config", folder, "--image", files[0], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input"] == [1, 3, 32, 32]


def test_hookscopes_own_presets_and_an_explicit_size(tmp_path: Path) -> None:
    files = _files(tmp_path)
    demo = hookscope.load_images("demo", files[0])
    assert demo.transform.library is None and demo.x.shape == (1, 3, 64, 64) and torch.equal(demo.x, demo.pictures)
    sized = hookscope.load_images("torchvision:resnet18", files, weights="DEFAULT", size=(40, 48))
    assert sized.x.shape == (2, 3, 40, 48) and sized.transform.library is None  # a plain resize by hookscope
    assert sized.transform.mean == (0.485, 0.456, 0.406)  # with the weights' mean and std
    imagenet = hookscope.image_transform("torchvision:resnet18")
    assert (imagenet.name, imagenet.size, imagenet.resize, imagenet.library) == ("imagenet", (224, 224), 256, None)


@pytest.mark.parametrize(("call", "message"), [
    (lambda d: hookscope.load_images("demo", str(d / "none.png")), "no such image file: {d}/none.png"),
    (lambda d: hookscope.load_images("demo", str(d)), "paths {d} holds no image file (.png, .jpg, .jpeg, ...); "
                                                      "give a folder of images or an image file"),
    (lambda d: hookscope.load_images("demo", [], preset="imagenet"), "give an image with paths (a file or a folder "
                                                                      "of images)"),
    (lambda d: hookscope.image_transform("demo", preset="imagenett"), "preset= 'imagenett' is not one of auto, "
                                                                       "imagenet, demo, none"),
    (lambda d: hookscope.image_transform("demo", size=(0, 4)), "size= (0, 4) is not HxW; write it like (224, 224)"),
    (lambda d: hookscope.image_transform("demo", size="4y4"), "size= '4y4' is not HxW; write it like (224, 224)"),
])
def test_mistakes_are_one_line_in_pythons_words(tmp_path: Path, call: object, message: str) -> None:
    with pytest.raises(hookscope.LoadError) as e:
        call(tmp_path)  # type: ignore[operator]
    assert str(e.value) == message.format(d=tmp_path)


def test_a_broken_preprocessor_config_is_one_line(tmp_path: Path) -> None:
    folder = Path(_hf_folder(tmp_path, "vit"))
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "NoSuchProcessor"}))
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.image_transform("hf:image-classification", config=str(folder))
    assert str(e.value).startswith(f"transformers cannot read the image processor in config= {folder} (")
    assert "\n" not in str(e.value)


def test_images_of_a_data_loader_worker_pickle(tmp_path: Path) -> None:
    import pickle

    t = hookscope.image_transform("timm:resnet10t")
    again = pickle.loads(pickle.dumps(t))
    picture = hookscope.loading.read_image(_files(tmp_path)[0])
    assert torch.equal(again(picture), t(picture))


def test_the_size_is_the_processors_own_output(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = _hf_folder(tmp_path, "vit")  # its config says 32 x 32
    transformers.ViTImageProcessor(size={"height": 48, "width": 40}).save_pretrained(folder)
    batch = hookscope.load_images("hf:image-classification", _files(tmp_path), config=folder)
    assert batch.transform.size == (48, 40) and batch.x.shape == (2, 3, 48, 40)


def test_a_grey_picture_goes_through_the_library_as_rgb(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    grey = tmp_path / "grey.png"
    PIL.fromarray(np.random.default_rng(2).integers(0, 256, (50, 60), dtype=np.uint8), "L").save(grey)
    t = hookscope.image_transform("timm:resnet10t")
    from_file = hookscope.load_images("timm:resnet10t", str(grey)).x[0]
    assert torch.equal(t(hookscope.loading.read_image(grey)[:1]), from_file)
    assert torch.equal(from_file, t.runs.transform(_rgb(str(grey))))  # type: ignore[union-attr]


def test_a_processor_naming_its_own_code_is_refused_and_paths_may_be_paths(tmp_path: Path) -> None:
    folder = Path(_hf_folder(tmp_path, "vit"))
    config = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**config, "auto_map": {"AutoImageProcessor": "evil.P"}}))
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.load_images("hf:image-classification", _files(tmp_path), config=str(folder))
    assert "naming the folder's own Python code (evil)" in str(e.value) and "\n" not in str(e.value)
    files = [Path(f) for f in _files(tmp_path)]
    assert hookscope.load_images("demo", files).paths == [str(f) for f in files]
