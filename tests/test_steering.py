"""Steering directions: found by difference of means on a tiny model trained on a toy language whose
topic token plants the feature, steering there moves the continuation as planted (the first
generated token included, with and without the cache); baked equals hooked; bad input is refused
in one line with nothing left hooked."""

from __future__ import annotations

import pytest
import torch

import hookscope
from hookscope import tokens

transformers = pytest.importorskip("transformers")

A, B = 1, 2  # topic tokens: A is followed by tokens of SA only, B by tokens of SB only
SA, SB = torch.tensor([3, 4, 5, 6]), torch.tensor([7, 8, 9, 10])
NEW = 6


def _batch(n: int, g: torch.Generator) -> torch.Tensor:
    topic = torch.randint(0, 2, (n,), generator=g)
    picks = torch.randint(0, 4, (n, 5), generator=g)
    xs = torch.where(topic[:, None] == 0, SA[picks], SB[picks])
    return torch.cat([torch.where(topic == 0, A, B)[:, None], xs], 1)


@pytest.fixture(scope="module")
def toy():
    """A two-block GPT-2 trained (seconds) on the toy language; prompts of each topic."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=12, n_positions=16, bos_token_id=0,
                                  eos_token_id=11, pad_token_id=0)
    lm = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        x = _batch(32, g)
        loss = lm(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    lm.eval()
    assert loss < 1.5  # near ln 4: it learned that the topic picks the set
    pool = _batch(200, g)
    pos, neg = pool[pool[:, 0] == A][:20, :3], pool[pool[:, 0] == B][:20, :3]
    return lm, pos, neg


def _generate(lm, ids, use_cache=True, **kw):
    return lm.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0, use_cache=use_cache, **kw)[:, ids.shape[1]:]


def test_mean_difference_pca_and_probe_match_a_hand_computation(toy):
    lm, pos, neg = toy
    name = "transformer.h.0"
    with hookscope.capture(lm, name) as rp:
        lm(pos)
    with hookscope.capture(lm, name) as rn:
        lm(neg)
    hp, hn = rp[name].output[:, -1].double(), rn[name].output[:, -1].double()
    d = hookscope.direction(lm, pos, neg, layers=name)
    assert d.layer == name and d.counts == (20, 20)
    assert torch.allclose(d.vector.double(), hp.mean(0) - hn.mean(0), atol=1e-5)
    both = torch.cat([hp, hn])
    top = torch.linalg.svd(both - both.mean(0)).Vh[0]
    pca = hookscope.direction(lm, pos, neg, layers=name, method="pca")
    assert abs(float(pca.unit.double() @ top)) > 1 - 1e-5 and float(pca.vector.double() @ d.vector.double()) > 0
    probe = hookscope.direction(lm, pos, neg, layers=name, method="probe")
    scores_p, scores_n = hp @ probe.vector.double(), hn @ probe.vector.double()
    assert scores_p.min() > scores_n.max()  # the planted topic is linearly separable
    listed = hookscope.direction(lm, list(pos), list(neg), layers=name)  # one by one: the same samples
    assert torch.allclose(listed.vector, d.vector, atol=1e-5)
    assert hookscope.core.hook_count(lm) == 0


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_steering_generated_tokens_moves_every_generated_token_the_first_included(toy, use_cache):
    lm, pos, neg = toy
    plain = _generate(lm, neg, use_cache)
    assert torch.isin(plain, SB).all()  # topic B writes B's tokens
    d = hookscope.direction(lm, pos, neg, layers="transformer.h.0")
    with hookscope.steer(lm, direction=d, at=tokens.generated) as s:
        steered = _generate(lm, neg, use_cache)
    assert torch.isin(steered, SA).all()  # every generated token, the first one included
    assert s.counts["transformer.h.0"] == NEW
    # the positions after the prompt alone miss the first generated token: its logits come from
    # the prompt's last position
    after_prompt = tokens.position(list(range(neg.shape[1], neg.shape[1] + NEW - 1)))  # each token fed back
    with hookscope.steer(lm, direction=d, at=after_prompt):
        late = _generate(lm, neg, use_cache)
    assert torch.equal(late[:, 0], plain[:, 0]) and torch.isin(late[:, 1:], SA).float().mean() > 0.9
    assert hookscope.core.hook_count(lm) == 0


def test_steering_at_one_step_changes_that_token_and_what_follows_it(toy):
    lm, pos, neg = toy
    d = hookscope.direction(lm, pos, neg, layers="transformer.h.1")
    plain = _generate(lm, neg)
    with hookscope.steer(lm, "blocks.1.resid_post", direction=d, at=tokens.step(2)):
        steered = _generate(lm, neg)
    assert torch.equal(steered[:, :2], plain[:, :2]) and torch.isin(steered[:, 2], SA).all()


def test_ablating_scaling_and_clamping_change_the_component_along_the_direction(toy):
    lm, pos, neg = toy
    d, name = hookscope.direction(lm, pos, neg, layers="transformer.h.1"), "transformer.h.1"

    def along(**how):  # a capture entered after the steering sees the steered values
        with hookscope.steer(lm, direction=d, **how), hookscope.capture(lm, name) as rec:
            lm(pos)
        return rec[name].output @ d.unit

    with hookscope.capture(lm, name) as base:
        lm(pos)
    plain = base[name].output @ d.unit
    assert float(along(op="ablate").abs().max()) < 1e-5
    assert torch.allclose(along(op="scale", scale=3.0), 3 * plain, atol=1e-4)
    assert torch.allclose(along(op="clamp", bounds=(None, 0.5)), plain.clamp(max=0.5), atol=1e-5)
    assert torch.allclose(along(op="add", scale=2.0), plain + 2 * d.norm, atol=1e-4)


def _llama(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=32, vocab_size=40, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).eval().to(dtype)


def _bake_case(lm, where, op, scale, ids, dtype=torch.float32):
    torch.manual_seed(1)
    width = lm.config.hidden_size
    d = hookscope.Direction(torch.randn(width).to(dtype) * 2)
    s = hookscope.steer(lm, where, direction=d, op=op, scale=scale)
    baked = hookscope.bake(s, ids)
    with torch.no_grad():
        with s:
            hooked = lm(ids).logits.float()
            hooked_tokens = _generate(lm, ids)
        mine = baked(ids).logits.float()
    return baked, (hooked - mine).abs().max(), hooked_tokens, _generate(baked, ids)


IDS = torch.tensor([[3, 5, 7, 9], [4, 6, 8, 2]])


@pytest.mark.parametrize("where, op, scale", [
    ("transformer.h.0", "add", 2.0),          # a block: into its MLP output projection's bias
    ("blocks.1.attn_out", "add", -1.5),       # the attention's output projection's bias
    ("transformer.h.1.mlp.c_proj", "ablate", 1.0),  # a Conv1D's weights and bias projected
    ("transformer.h.0.attn.c_proj", "scale", 3.0),
    ("transformer.wte", "add", 1.0),          # tied to lm_head: untied, lm_head keeps its weights
    ("transformer.wte", "ablate", 1.0),
])
def test_baked_gpt2_gives_the_hooked_logits_and_greedy_tokens(toy, where, op, scale):
    lm = toy[0]
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    baked, err, hooked_tokens, baked_tokens = _bake_case(lm, where, op, scale, IDS)
    assert err <= 1e-5 and torch.equal(hooked_tokens, baked_tokens)
    assert all(torch.equal(v, lm.state_dict()[k]) for k, v in before.items())  # the steered model untouched
    if where == "transformer.wte":
        assert baked.lm_head.weight is not baked.transformer.wte.weight
        assert torch.equal(baked.lm_head.weight, lm.lm_head.weight)
    assert hookscope.core.hook_count(lm) == 0 and hookscope.core.hook_count(baked) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("where, op", [("model.layers.0", "add"), ("model.layers.1.self_attn.o_proj", "ablate"),
                                       ("model.layers.1.mlp.down_proj", "add")])
def test_baked_llama_adds_a_bias_where_none_was_and_matches_the_hooked_model(where, op, dtype):
    lm = _llama(dtype)
    assert lm.model.layers[0].mlp.down_proj.bias is None
    baked, err, hooked_tokens, baked_tokens = _bake_case(lm, where, op, 1.0, IDS, dtype)
    assert err <= (1e-5 if dtype == torch.float32 else 5e-2 * 4)
    if dtype == torch.float32:
        assert torch.equal(hooked_tokens, baked_tokens)
    if op == "add":
        assert "mlp.down_proj.bias" in " ".join(n for n, _ in baked.named_parameters())
        assert next(p for n, p in baked.named_parameters() if n.endswith("down_proj.bias")).dtype == dtype


def test_what_weights_cannot_express_is_refused_in_one_line(toy):
    lm, pos, neg = toy
    d = hookscope.direction(lm, pos, neg, layers="transformer.h.0")
    cases = [
        (hookscope.steer(lm, direction=d, op="clamp", bounds=(0, 1)), "not linear"),
        (hookscope.steer(lm, direction=d, at=tokens.generated), "weights act at every position"),
        (hookscope.steer(lm, direction=d, op="ablate"), "reaches the residual stream"),
        (hookscope.steer(lm, "transformer.ln_f", direction=d), "cannot be written into weights"),
    ]
    for steering, match in cases:
        with pytest.raises(hookscope.HookscopeError, match=match) as e:
            hookscope.bake(steering, IDS)
        assert "\n" not in str(e.value)
    assert hookscope.core.hook_count(lm) == 0


def test_a_direction_of_the_wrong_width_or_dtype_is_refused_and_nothing_stays_hooked(toy):
    lm, pos, neg = toy
    before = _generate(lm, neg[:2])
    for vector, match in [(torch.ones(15), "width 15"), (torch.ones(16, dtype=torch.float64), "float64")]:
        with pytest.raises(hookscope.HookscopeError, match=match) as e:
            with hookscope.steer(lm, "transformer.h.0", direction=vector, at=tokens.generated):
                _generate(lm, neg[:2])
        assert "\n" not in str(e.value)
        assert hookscope.core.hook_count(lm) == 0
    assert torch.equal(_generate(lm, neg[:2]), before)
    for make, match in [(lambda: hookscope.steer(lm, "transformer.h.0", direction=torch.ones(16), op="add_"), "'add'"),
                        (lambda: hookscope.steer(lm, "transformer.h.0", direction=torch.ones(2, 8)), "1-D"),
                        (lambda: hookscope.steer(lm, "transformer.h.0", direction=torch.zeros(16)), "not zero"),
                        (lambda: hookscope.steer(lm, direction=torch.ones(16)), "needs the layers"),
                        (lambda: hookscope.steer(lm, "blocks.0.attn.z", direction=torch.ones(16)), "input"),
                        (lambda: hookscope.direction(lm, pos, neg, layers="transformer.h.0", method="mean"), "mean_difference")]:
        with pytest.raises(hookscope.HookscopeError, match=match):
            make()


def test_a_direction_saves_and_loads_as_safetensors(toy, tmp_path):
    pytest.importorskip("safetensors")
    lm, pos, neg = toy
    d = hookscope.direction(lm, pos, neg, layers="transformer.h.0")
    d.save(tmp_path / "d.safetensors")
    back = hookscope.Direction.load(tmp_path / "d.safetensors")
    assert torch.equal(back.vector, d.vector) and back.layer == "transformer.h.0" and back.method == "mean_difference"
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(hookscope.HookscopeError, match="not a readable safetensors file"):
        hookscope.Direction.load(tmp_path / "bad.safetensors")


def test_a_component_name_steers_and_bakes_its_module(toy):
    # "blocks.0.resid_post" is block 0's whole output: steered there and baked into that block's weights
    lm, pos, neg = toy
    d = hookscope.direction(lm, pos, neg, layers="transformer.h.0")
    steering = hookscope.steer(lm, "blocks.0.resid_post", direction=d, scale=4.0)
    assert steering.names == ["transformer.h.0"]
    baked = hookscope.bake(steering, IDS)
    with steering:
        hooked = _generate(lm, IDS)
    assert torch.equal(_generate(baked, IDS), hooked)
    assert hookscope.core.hook_count(lm) == 0 and hookscope.core.hook_count(baked) == 0
