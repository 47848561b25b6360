"""Token positions during generate(): records at absolute position p equal the no-cache forward's
at p on every step, with and without the cache, left-padded batches included; edits there run the
same computation either way; bad positions are refused in one line with nothing left hooked."""

from __future__ import annotations

import pytest
import torch

import hookscope
from hookscope import tokens
from hookscope.generation import frame_of

transformers = pytest.importorskip("transformers")


def _gpt2() -> tuple[torch.nn.Module, str]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg).eval(), "transformer.h.1"


def _llama() -> tuple[torch.nn.Module, str]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=32, vocab_size=40)
    return transformers.LlamaForCausalLM(cfg).eval(), "model.layers.1"


MODELS = {"gpt2": _gpt2, "llama": _llama}
IDS = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 3]])  # row 0 left-padded: its own tokens are 5, 6
MASK = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
NEW = 5


def _generate(lm, use_cache, sample=False, seed=0):
    torch.manual_seed(seed)
    return lm.generate(IDS, attention_mask=MASK, max_new_tokens=NEW, do_sample=sample, use_cache=use_cache,
                       pad_token_id=0, top_k=0)


def _full_forward(lm, name, out):
    """The no-cache forward over the whole final sequence, positions as generate() numbers them."""
    mask = torch.cat([MASK, torch.ones(2, out.shape[1] - MASK.shape[1], dtype=MASK.dtype)], 1)
    with hookscope.capture(lm, name) as rec:
        lm(out, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    h = rec[name].output
    return h[0] if isinstance(h, tuple) else h, mask


def test_frames_number_the_sequences_own_tokens_pads_excluded():
    f0 = frame_of((), {"input_ids": IDS, "attention_mask": MASK}, None)
    assert f0.positions.tolist() == [[-1, -1, 0, 1], [0, 1, 2, 3]] and f0.prompt.tolist() == [2, 4]
    grown = torch.cat([MASK, torch.ones(2, 1, dtype=MASK.dtype)], 1)

    class Cache:
        def get_seq_length(self):
            return 4

    f1 = frame_of((), {"input_ids": IDS[:, :1], "attention_mask": grown, "past_key_values": Cache()}, f0)
    assert (f1.step, f1.fresh, f1.positions.tolist(), f1.prompt.tolist()) == (1, 1, [[2], [4]], [2, 4])
    nocache = frame_of((), {"input_ids": torch.cat([IDS, IDS[:, :1]], 1), "attention_mask": grown}, f0, IDS)
    assert (nocache.step, nocache.fresh, nocache.positions[:, -1].tolist()) == (1, 1, [2, 4])
    fresh = frame_of((), {"input_ids": torch.cat([IDS, IDS[:, :1]], 1) + 1, "attention_mask": grown}, f0, IDS)
    assert (fresh.sequence, fresh.step) == (1, 0)  # other tokens: a new sequence, not a step


@pytest.mark.parametrize("family", MODELS)
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_records_at_each_position_equal_the_full_forward_with_and_without_cache(family, sample):
    lm, name = MODELS[family]()
    got = {}
    for use_cache in (True, False):
        with hookscope.capture(lm, name, at=tokens.generated) as rec:
            out = _generate(lm, use_cache, sample)
        got[use_cache] = (out, tokens.records(rec)[name])
    (out, cached), (out2, plain) = got[True], got[False]
    assert torch.equal(out, out2)
    full, mask = _full_forward(lm, name, out)
    # generated: the last prompt token's position and every fed-back token, one per step
    assert cached.positions().tolist() == [[1, 2, 3, 4, 5], [3, 4, 5, 6, 7]]
    assert [r.step for r in cached.rows if r.row == 0] == [0, 1, 2, 3, 4]
    for record in (cached, plain):
        t = record.tensor()
        assert t.shape == (2, NEW, 16)
        # in the padded layout, positions len-1 .. len+NEW-2 are columns 3 .. 7 for both rows
        assert (t - full[:, 3:3 + NEW]).abs().max() < 1e-5
    for row, pos in [(0, 0), (0, 4), (1, 7)]:
        col = int((mask[row].cumsum(0) - 1 == pos).nonzero()[0])
        with hookscope.capture(lm, name, at=tokens.position(pos)) as rec:
            _generate(lm, True, sample)
        with hookscope.capture(lm, name, at=tokens.position(pos)) as rec_nc:
            _generate(lm, False, sample)
        a, b = tokens.records(rec)[name].get(row, pos), tokens.records(rec_nc)[name].get(row, pos)
        assert (a - full[row, col]).abs().max() < 1e-5 and (b - full[row, col]).abs().max() < 1e-5
    assert hookscope.core.hook_count(lm) == 0


@pytest.mark.parametrize("family", MODELS)
def test_prompt_records_are_the_rows_own_tokens_recorded_once(family):
    lm, name = MODELS[family]()
    with hookscope.capture(lm, name, at=tokens.prompt) as rec:
        out = _generate(lm, False)  # without the cache the prompt is computed again at every step
    record = tokens.records(rec)[name]
    assert record.positions().tolist() == [[0, 1, -1, -1], [0, 1, 2, 3]]
    assert {r.step for r in record.rows} == {0}
    with pytest.raises(hookscope.HookscopeError, match="fill="):
        record.tensor()
    full, _ = _full_forward(lm, name, out)
    t = record.tensor(fill=float("nan"))
    assert (t[0, :2] - full[0, 2:4]).abs().max() < 1e-5 and (t[1] - full[1, :4]).abs().max() < 1e-5
    assert torch.isnan(t[0, 2:]).all()


@pytest.mark.parametrize("family", MODELS)
def test_step_k_is_the_position_that_writes_generated_token_k(family):
    lm, name = MODELS[family]()
    with hookscope.capture(lm, name, at=tokens.step([0, 3])) as rec:
        out = _generate(lm, True)
    record = tokens.records(rec)[name]
    assert record.positions().tolist() == [[1, 4], [3, 6]]
    assert sorted({r.step for r in record.rows}) == [0, 3]
    full, _ = _full_forward(lm, name, out)
    assert (record.tensor() - full[:, [3, 6]]).abs().max() < 1e-5
    assert hookscope.core.hook_count(lm) == 0


@pytest.mark.parametrize("family", MODELS)
def test_an_edit_at_generated_tokens_is_the_same_computation_with_and_without_cache(family):
    lm, name = MODELS[family]()
    plain = _generate(lm, True)
    v = torch.randn(16) * 3
    outs, first_logits = [], []
    for use_cache in (True, False):
        with hookscope.edit(lm, name, output=lambda x: x + v, at=tokens.generated):
            outs.append(_generate(lm, use_cache))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0][:, 4], plain[:, 4])  # the first generated token changed too
    # by hand: the same edit on a full forward of the steered sequence, positions >= len - 1
    mask = torch.cat([MASK, torch.ones(2, NEW, dtype=MASK.dtype)], 1)
    where = torch.zeros(2, mask.shape[1], dtype=torch.bool)
    where[:, 3:] = True

    def by_hand(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        h = h + where[:, : h.shape[1], None] * v
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = dict(lm.named_modules())[name].register_forward_hook(by_hand)
    try:
        logits = lm(outs[0], attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    finally:
        handle.remove()
    assert torch.equal(logits[:, 3:-1].argmax(-1), outs[0][:, 4:])
    first_logits.append(logits)
    assert hookscope.core.hook_count(lm) == 0


def test_a_cached_prompt_edit_reaches_the_cache():
    lm, name = _gpt2()
    v = torch.randn(16) * 3
    outs = []
    for use_cache in (True, False):
        with hookscope.edit(lm, name, output=lambda x: x + v, at=tokens.position(0)) as ed:
            outs.append(_generate(lm, use_cache))
        assert ed.counts[name] == NEW
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("bad, match", [
    (lambda: tokens.step(NEW), r"tokens.step\(5\) never ran: the generation ran steps 0..4"),
    (lambda: tokens.position(NEW + 4), r"tokens.position\(9\) is beyond the sequence: the longest held 8"),
])
@pytest.mark.parametrize("how", ["capture", "edit"])
def test_a_step_or_position_never_reached_is_refused_in_one_line(bad, match, how):
    lm, name = _gpt2()
    opened = (hookscope.capture(lm, name, at=bad()) if how == "capture"
              else hookscope.edit(lm, name, output=lambda x: x, at=bad()))
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        with opened:
            _generate(lm, True)
    assert "\n" not in str(e.value)
    assert hookscope.core.hook_count(lm) == 0


def test_bad_positions_and_modules_are_refused_in_one_line():
    for make, match in [(lambda: tokens.position(-1), "negative"), (lambda: tokens.step("a"), "an int"),
                        (lambda: tokens.position([]), "names no position")]:
        with pytest.raises(hookscope.HookscopeError, match=match):
            make()
    lm, _ = _gpt2()
    with pytest.raises(hookscope.HookscopeError, match="keeps the token axis"):
        with hookscope.capture(lm, "lm_head", at=tokens.generated):  # logits_to_keep: lm_head sees one column
            _generate(lm, True)
    with pytest.raises(hookscope.HookscopeError, match="returned"):
        with hookscope.edit(lm, "transformer.h.0", output=lambda x: x[:1], at=tokens.generated):
            _generate(lm, True)
    with pytest.raises(hookscope.HookscopeError, match="reads a capture made with at="):
        with hookscope.capture(lm, "transformer.h.0") as rec:
            lm(IDS)
        tokens.records(rec)
    assert hookscope.core.hook_count(lm) == 0


def test_a_generation_that_raises_leaves_nothing_hooked_and_the_model_usable():
    lm, name = _gpt2()
    before = _generate(lm, True)

    def boom(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with hookscope.edit(lm, name, output=boom, at=tokens.generated):
            _generate(lm, True)
    assert hookscope.core.hook_count(lm) == 0
    assert torch.equal(_generate(lm, True), before)


def test_records_of_several_generations_are_kept_apart():
    lm, name = _gpt2()
    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        _generate(lm, True)
        _generate(lm, False)
    record = tokens.records(rec)[name]
    assert sorted({r.sequence for r in record.rows}) == [0, 1]
    with pytest.raises(hookscope.HookscopeError, match="sequence="):
        record.tensor()
    assert (record.tensor(sequence=0) - record.tensor(sequence=1)).abs().max() < 1e-5
    assert "transformer.h.1" in tokens.records(rec) and "step" in tokens.records(rec).table()


def _edit_refused(lm, name, match, **kw):
    before = lm.generate(**kw)
    with pytest.raises(hookscope.HookscopeError, match=match):
        with hookscope.edit(lm, name, output=lambda x: x + 1.0, at=tokens.generated):
            lm.generate(**kw)
    assert hookscope.core.hook_count(lm) == 0
    assert torch.equal(lm.generate(**kw), before)  # the model untouched


@pytest.mark.parametrize("family", MODELS)
def test_beam_search_is_refused_in_one_line_by_capture_and_edit(family):
    # beam search reorders the rows between steps, which the forward's inputs do not show
    lm, name = MODELS[family]()
    kw = dict(input_ids=IDS, attention_mask=MASK, max_new_tokens=3, do_sample=False, pad_token_id=0, num_beams=2)
    with pytest.raises(hookscope.HookscopeError, match="beam search") as info:
        with hookscope.capture(lm, name, at=tokens.generated):
            lm.generate(**kw)
    assert "\n" not in str(info.value)
    assert hookscope.core.hook_count(lm) == 0
    _edit_refused(lm, name, "beam search", **kw)


def test_assisted_decoding_is_refused_in_one_line():
    lm, name = _gpt2()
    torch.manual_seed(1)
    helper = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40,
                                                                  n_positions=64)).eval()
    kw = dict(input_ids=IDS[1:], attention_mask=MASK[1:], max_new_tokens=4, do_sample=False, pad_token_id=0,
              assistant_model=helper)
    with pytest.raises(hookscope.HookscopeError, match="assisted"):
        with hookscope.capture(lm, name, at=tokens.generated):
            lm.generate(**kw)
    assert hookscope.core.hook_count(lm) == 0 and hookscope.core.hook_count(helper) == 0
    _edit_refused(lm, name, "assisted", **kw)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_rows_finished_early_record_no_pad_position(use_cache):
    lm, name = _gpt2()
    free = lm.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, pad_token_id=0)
    eos = int(free[0, 4])  # row 0's first generated token ends row 0 at once; row 1 never writes it
    assert eos not in free[1, 4:].tolist()
    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        out = lm.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, pad_token_id=0,
                          eos_token_id=eos, use_cache=use_cache)
    assert out[0, 5:].tolist() == [0, 0, 0]  # row 0 is fed pads after its end token
    record = tokens.records(rec)[name]
    assert sorted(r.position for r in record.rows if r.row == 0) == [1]  # only the step writing the end token
    assert sorted(r.position for r in record.rows if r.row == 1) == [3, 4, 5, 6]
    full, _ = _full_forward(lm, name, out)
    assert torch.allclose(record.get(1, 6), full[1, 6], atol=1e-5)
    assert torch.allclose(record.get(0, 1), full[0, 3], atol=1e-5)


def test_sampled_rows_expanded_by_num_return_sequences_keep_their_positions():
    lm, name = _gpt2()
    gen = dict(max_new_tokens=3, do_sample=True, top_k=0, pad_token_id=0, num_return_sequences=3)
    torch.manual_seed(3)
    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        out = lm.generate(IDS, attention_mask=MASK, **gen)
    record = tokens.records(rec)[name]
    mask = torch.cat([MASK.repeat_interleave(3, 0), torch.ones(6, 3, dtype=MASK.dtype)], 1)
    with hookscope.capture(lm, name) as full_rec:
        lm(out, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    h = full_rec[name].output
    full = h[0] if isinstance(h, tuple) else h
    assert len(record.rows) == 6 * 3
    for r in record.rows:
        col = r.position + (2 if r.row < 3 else 0)  # rows 0..2 copy the left-padded prompt
        assert torch.allclose(record.get(r.row, r.position), full[r.row, col], atol=1e-5)


def test_an_encoder_decoder_is_refused_in_one_line_naming_why():
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=40, decoder_start_token_id=0)).eval()
    for block in (hookscope.capture(t5, "decoder.block.0", at=tokens.generated),
                  hookscope.edit(t5, "decoder.block.0", output=lambda x: x, at=tokens.generated)):
        with pytest.raises(hookscope.HookscopeError, match="encoder-decoder"):
            with block:
                t5.generate(IDS, attention_mask=MASK, max_new_tokens=2)
    assert hookscope.core.hook_count(t5) == 0


def test_a_static_cache_is_refused_in_one_line_naming_it():
    lm, name = _gpt2()
    with pytest.raises(hookscope.HookscopeError, match="static"):
        with hookscope.capture(lm, name, at=tokens.generated):
            lm.generate(IDS, attention_mask=MASK, max_new_tokens=2, do_sample=False, pad_token_id=0,
                        cache_implementation="static")
    assert hookscope.core.hook_count(lm) == 0


def test_a_plain_forward_and_a_second_generate_in_the_block_are_sequences_of_their_own():
    # without the cache a forward over the finished sequence, or a generate() continuing it, has the inputs of a
    # next step; they are another call, so another sequence starting at step 0
    lm, name = _gpt2()
    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        out = _generate(lm, False)
        mask = torch.cat([MASK, torch.ones(2, NEW, dtype=MASK.dtype)], 1)
        lm(out, attention_mask=mask)
        lm.generate(out, attention_mask=mask, max_new_tokens=2, do_sample=False, use_cache=False, pad_token_id=0)
    rows = tokens.records(rec)[name].rows
    assert sorted({r.sequence for r in rows}) == [0, 1, 2]
    assert {r.step for r in rows if r.sequence == 0} == set(range(NEW))
    plain = [r for r in rows if r.sequence == 1]
    assert {r.step for r in plain} == {0} and [r.position for r in plain if r.row == 1] == [8]  # its prompt is all 9 tokens
    assert sorted(r.position for r in rows if r.sequence == 2 and r.row == 1) == [8, 9]


def test_a_forward_from_another_thread_inside_the_block_is_refused():
    import threading

    lm, name = _gpt2()
    errors = []

    def other():
        try:
            _generate(lm, True)
        except hookscope.HookscopeError as e:
            errors.append(str(e))

    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        _generate(lm, True)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(errors) == 1 and "thread" in errors[0]
    assert {r.sequence for r in tokens.records(rec)[name].rows} == {0}
    assert hookscope.core.hook_count(lm) == 0


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_left_padded_rows_of_very_different_lengths_record_the_full_forwards_values(use_cache):
    lm, name = _llama()
    ids = torch.tensor([[0, 0, 0, 0, 7], [1, 2, 3, 4, 5], [0, 0, 9, 8, 7]])
    mask = torch.tensor([[0, 0, 0, 0, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with hookscope.capture(lm, name, at=tokens.generated) as rec:
        out = lm.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                          use_cache=use_cache)
    record = tokens.records(rec)[name]
    grown = torch.cat([mask, torch.ones(3, 4, dtype=mask.dtype)], 1)
    with hookscope.capture(lm, name) as full_rec:
        lm(out, attention_mask=grown, position_ids=(grown.cumsum(1) - 1).clamp(min=0))
    h = full_rec[name].output
    full = h[0] if isinstance(h, tuple) else h
    assert record.positions().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [2, 3, 4, 5]]
    for r in record.rows:
        col = r.position + int((mask[r.row] == 0).sum())
        assert torch.allclose(record.get(r.row, r.position), full[r.row, col], atol=1e-5)
