"""A compacted transformers model loaded back from its save_pretrained folder (load_pretrained): BERT and
GPT-2, whose config cannot say fewer heads, with per-layer head counts and narrower MLPs; tied weights
still tied; and every folder it must refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hookscope
from hookscope.analysis.prune import load_pretrained

transformers = pytest.importorskip("transformers")


def _gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16, n_inner=24)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval(), torch.randint(0, 50, (2, 7))


def _bert() -> tuple[torch.nn.Module, torch.Tensor]:
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=24, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg).eval(), torch.randint(0, 40, (2, 7))


def _compacted(model: torch.nn.Module, ids: torch.Tensor, heads: dict[str, list[int]]) -> torch.nn.Module:
    hookscope.prune_heads(model, ids, heads=heads)
    hookscope.prune_channels(model, ids, amount=0.25, layers="*.c_fc" if "GPT2" in type(model).__name__
                             else "*.intermediate.dense", kwargs={"use_cache": False} if "GPT2" in type(model).__name__
                             else None)
    return hookscope.compact(model, ids, kwargs={"use_cache": False} if "GPT2" in type(model).__name__ else None)


def test_gpt2_with_a_different_head_count_per_layer_loads_back(tmp_path: Path) -> None:
    model, ids = _gpt2()
    small = _compacted(model, ids, {"transformer.h.0.attn": [0, 1, 2], "transformer.h.1.attn": [3]})
    small.save_pretrained(tmp_path)
    with pytest.raises(Exception):  # transformers itself cannot rebuild these shapes from the config
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    back = load_pretrained(tmp_path)
    assert type(back) is transformers.GPT2LMHeadModel and not back.training
    assert [blk.attn.num_heads for blk in back.transformer.h] == [1, 3]
    assert back.lm_head.weight is back.transformer.wte.weight  # still tied
    want, got = small(ids, use_cache=False).logits, back(ids, use_cache=False).logits
    assert torch.equal(want, got)


def test_bert_classifier_loads_back_with_the_class_given(tmp_path: Path) -> None:
    model, ids = _bert()
    small = _compacted(model, ids, {"bert.encoder.layer.0.attention.self": [1], "bert.encoder.layer.1.attention.self": [0, 2]})
    small.save_pretrained(tmp_path)
    back = load_pretrained(tmp_path, cls=transformers.BertForSequenceClassification)
    heads = [layer.attention.self.num_attention_heads for layer in back.bert.encoder.layer]
    assert heads == [3, 2] and back.bert.encoder.layer[0].intermediate.dense.out_features < 24
    assert torch.equal(small(ids).logits, back(ids).logits)


def test_a_llama_loads_both_ways(tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    model, ids = transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 40, (1, 6))
    hookscope.prune_heads(model, ids, amount=0.5, kwargs={"use_cache": False})
    small = hookscope.compact(model, ids, kwargs={"use_cache": False})
    small.save_pretrained(tmp_path)
    ours, theirs = load_pretrained(tmp_path), transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_folders_it_cannot_read_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(hookscope.HookscopeError, match="no config.json"):
        load_pretrained(tmp_path)
    model, _ = _bert()
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # a pickle is never read
    with pytest.raises(hookscope.HookscopeError, match="no model.safetensors.*save_pretrained"):
        load_pretrained(tmp_path)


def test_a_class_that_did_not_save_the_weights_is_refused(tmp_path: Path) -> None:
    model, _ = _bert()
    model.save_pretrained(tmp_path)
    with pytest.raises(hookscope.HookscopeError, match=r"hold bert\.embeddings.* which BertModel has not; pass the class"):
        load_pretrained(tmp_path, cls=transformers.BertModel)
    cfg = transformers.BertConfig.from_pretrained(tmp_path)
    cfg.architectures = None
    cfg.save_pretrained(tmp_path)
    with pytest.raises(hookscope.HookscopeError, match="names no transformers model class.*cls="):
        load_pretrained(tmp_path)


def test_weights_the_file_lacks_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model, _ = _bert()
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["classifier.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(hookscope.HookscopeError, match="lack classifier.weight"):
        load_pretrained(tmp_path)


def test_a_width_pruned_gpt2_loads_back_tied(tmp_path: Path) -> None:
    model, ids = _gpt2()
    hookscope.prune_width(model, ids, amount=0.25, kwargs={"use_cache": False})
    small = hookscope.compact(model, ids, kwargs={"use_cache": False})
    small.save_pretrained(tmp_path)
    back = load_pretrained(tmp_path)
    assert back.transformer.wte.weight.shape == (50, 24) and back.lm_head.weight is back.transformer.wte.weight
    assert torch.equal(back(ids, use_cache=False).logits, small(ids, use_cache=False).logits)


@pytest.mark.parametrize("edit, match", [
    ({"architectures": ["logging"]}, r"names logging, which is not a transformers model class; pass the class.*cls="),
    ({"num_attention_heads": 3}, r"cannot build BertForSequenceClassification from .*config\.json \(ValueError: "
                                 r"The hidden size \(32\) is not a multiple")])
def test_a_config_that_builds_no_model_is_refused_in_one_line(edit: dict, match: str, tmp_path: Path) -> None:
    import json

    model, _ = _bert()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(hookscope.HookscopeError, match=match) as err:
        load_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def test_a_vit_saved_under_its_checkpoint_names_loads_back_both_ways(tmp_path: Path) -> None:
    # transformers saves ViT under the names of its checkpoints (attention.attention.query ...) and renames
    # them to its modules' names (attention.q_proj ...) when loading; load_pretrained renames them alike
    cfg = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=32, num_labels=3)
    torch.manual_seed(0)
    model, x = transformers.ViTForImageClassification(cfg).eval(), torch.randn(2, 3, 16, 16)
    model.save_pretrained(tmp_path / "full")
    assert torch.equal(load_pretrained(tmp_path / "full")(x).logits, model(x).logits)
    hookscope.prune_heads(model, x, amount=0.5, mlp=0.5)
    small = hookscope.compact(model, x)
    small.save_pretrained(tmp_path / "small")
    ours, theirs = load_pretrained(tmp_path / "small"), type(model).from_pretrained(tmp_path / "small").eval()
    assert ours.config.intermediate_size == theirs.config.intermediate_size == 16
    assert torch.equal(ours(x).logits, small(x).logits) and torch.equal(theirs(x).logits, small(x).logits)


def _missing_shard(folder: Path) -> None:
    (folder / "model-00001-of-00003.safetensors").unlink()


def _truncated_shard(folder: Path) -> None:
    shard = folder / "model-00001-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])


def _index(folder: Path, text: str) -> None:
    (folder / "model.safetensors.index.json").write_text(text)


@pytest.mark.parametrize("spoil, match", [
    (_missing_shard, r"model-00001-of-00003\.safetensors, which .*index\.json names, is missing"),
    (_truncated_shard, r"cannot read model-00001-of-00003\.safetensors \(SafetensorError"),
    (lambda f: _index(f, "{}"), r"model\.safetensors\.index\.json is not a weight_map"),
    (lambda f: _index(f, '{"weight_map": {"pooler.dense.weight": "../x.safetensors"}}'),
     r"names \.\./x\.safetensors, outside the folder"),
    (lambda f: (f / "config.json").write_text("{not json"), r"cannot read .*config\.json \(OSError")])
def test_a_spoiled_sharded_folder_is_refused_in_one_line(spoil, match: str, tmp_path: Path) -> None:
    model, _ = _bert()
    model.save_pretrained(tmp_path, max_shard_size="30KB")
    assert len(list(tmp_path.glob("*.safetensors"))) == 3
    spoil(tmp_path)
    with pytest.raises(hookscope.HookscopeError, match=match) as err:
        load_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def _remote_code_folder(folder: Path) -> Path:
    """A folder whose config asks transformers to import the folder's own code, which writes a marker."""
    import json

    from safetensors.torch import save_file

    marker = folder / "marker.txt"
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "architectures": ["EvilModel"],
                                                    "auto_map": {"AutoConfig": "evil.EvilConfig"}}))
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return marker


def test_a_folder_asking_to_run_its_own_code_is_refused_without_a_prompt(tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = _remote_code_folder(tmp_path)
    code = ("import sys, hookscope\nfrom hookscope.analysis.prune import load_pretrained\n"
            "try:\n    load_pretrained(sys.argv[1])\nexcept hookscope.HookscopeError as e:\n    print('REFUSED', e)\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], input="y\ny\n", capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert not marker.exists()  # the folder's code never ran, though "y" waited on stdin
    assert run.stdout.startswith("REFUSED") and "auto_map" in run.stdout and "trust" not in run.stderr.lower()
    assert "[y/N]" not in run.stdout + run.stderr


def test_no_transformers_loading_call_in_the_pruning_code_can_run_a_folders_code() -> None:
    import re

    src = Path(hookscope.__file__).parent
    calls = re.compile(r"\b(from_pretrained|from_config|Auto[A-Z]\w*|pipeline)\b\s*(\.\s*\w+\s*)?\(")
    unsafe = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        for found in calls.finditer(text):
            line_start = text.rfind("\n", 0, found.start()) + 1
            line = text[line_start:text.find("\n", found.end())]
            if line.lstrip().startswith((">>>", "...", "#")) or '"' in line[:found.start() - line_start]:
                continue
            depth, end = 0, found.end() - 1
            while end < len(text):  # the call's own parentheses
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
                end += 1
            if "trust_remote_code=False" not in text[found.start():end]:
                unsafe.append(f"{path.relative_to(src)}:{text.count(chr(10), 0, found.start()) + 1}")
    assert unsafe == []


def test_a_bfloat16_folder_loads_in_bfloat16_as_from_pretrained_builds_it(tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    model, ids = transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 40, (1, 6))
    hookscope.prune_heads(model, ids, amount=0.5, kwargs={"use_cache": False})
    small = hookscope.compact(model, ids, kwargs={"use_cache": False}).to(torch.bfloat16)
    small.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    assert ours.model.rotary_emb.inv_freq.dtype == theirs.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(ours(ids).logits, theirs(ids).logits)
    assert torch.get_default_dtype() == torch.float32
