"""mhla.transformers: an MHLA causal language model in Hugging Face transformers."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import mhla.torch as mt  # noqa: E402
from mhla.transformers import MHLAConfig, MHLAForCausalLM  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def small_model(**overrides):
    torch.manual_seed(0)
    # A wide initialisation, so that the logits are far from ties and argmax is a sharp test.
    options = dict(vocab_size=61, hidden_size=32, num_attention_heads=2, num_hidden_layers=2, block_size=4,
                   max_position_embeddings=64, initializer_range=0.3)
    options.update(overrides)
    return MHLAForCausalLM(MHLAConfig(**options)).eval()


def train(model, tokens, *, steps):
    """The losses of `steps` AdamW steps of next-token prediction on `tokens`."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(tokens, labels=tokens).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def test_greedy_generate_on_the_decoders_equals_argmax_of_the_full_forward():
    model = small_model()
    prompt = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    generated = model.generate(prompt, max_new_tokens=13, do_sample=False)
    sequence = prompt
    with torch.no_grad():
        for _ in range(13):
            following = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, following], dim=1)
    assert torch.equal(generated, sequence)


def test_a_cached_step_gives_the_full_forwards_logits():
    model = small_model(feature_map="relu")
    tokens = torch.randint(0, 61, (3, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens).logits
        prefix = model(tokens[:, :11], use_cache=True)
        torch.testing.assert_close(prefix.logits, full[:, :11], rtol=1e-4, atol=1e-5)
        cache = prefix.cache
        for t in range(11, 19):
            step = model(tokens[:, t:t + 1], cache=cache)
            cache = step.cache
            torch.testing.assert_close(step.logits[:, 0], full[:, t], rtol=1e-4, atol=1e-5)
    assert cache.get_seq_length() == 19


def test_each_block_attends_with_the_packages_own_layer():
    model = small_model()
    layer = model.layers[0].attention
    assert isinstance(layer, mt.MHLA1d) and layer.masking == "causal"
    assert layer.block_size == 4 and layer.max_tokens == 64


def test_save_pretrained_and_from_pretrained_round_trip(tmp_path):
    model = small_model()
    with torch.no_grad():
        model.layers[1].attention.mixing.logits.add_(0.25)  # a trained-looking mixing matrix
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, MHLAConfig) and config.block_size == 4
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, MHLAForCausalLM)
    tokens = torch.randint(0, 61, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens).logits, rtol=0, atol=0)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_a_float64_model_round_trips_bit_for_bit(tmp_path):
    model = small_model().double()
    with torch.no_grad():
        model.layers[1].attention.mixing.logits.add_(torch.full_like(model.layers[1].attention.mixing.logits, 0.1))
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    for name, value in model.state_dict().items():
        got = loaded.state_dict()[name]
        assert got.dtype == value.dtype == torch.float64, name
        torch.testing.assert_close(got, value, rtol=0, atol=0, msg=name)


def test_position_ids_are_honoured_only_as_the_tokens_count():
    model = small_model()
    tokens = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = model(tokens).logits
        counted = model(tokens, position_ids=torch.arange(8).expand(2, 8)).logits
        torch.testing.assert_close(counted, plain, rtol=0, atol=0)
        with pytest.raises(ValueError, match="position_ids must count the tokens from 0"):
            model(tokens, position_ids=torch.arange(3, 11).expand(2, 8))
        cached = model(tokens[:, :5], use_cache=True)
        model(tokens[:, 5:6], cache=cached.cache, position_ids=torch.full((2, 1), 5))
        with pytest.raises(ValueError, match="position_ids must count the tokens from 6"):
            model(tokens[:, 6:7], cache=cached.cache, position_ids=torch.full((2, 1), 9))


def test_a_few_training_steps_lower_the_loss():
    model = small_model(initializer_range=0.02).train()
    losses = train(model, torch.arange(48).remainder(8).repeat(4, 1), steps=25)  # a periodic sequence
    assert losses[-1] < 0.5 * losses[0], losses
    assert model.layers[0].attention.mixing.logits.grad is not None


def test_what_it_cannot_honour_is_refused_by_name():
    model = small_model()
    tokens = torch.randint(0, 61, (2, 8))
    padded = torch.ones(2, 8, dtype=torch.long)
    padded[0, :3] = 0
    with pytest.raises(ValueError, match="MHLAForCausalLM takes no padding"):
        model(tokens, attention_mask=padded)
    with pytest.raises(TypeError, match="unsupported arguments: output_attentions"):
        model(tokens, output_attentions=True)
    with pytest.raises(TypeError, match="cache must be the MHLALanguageModelCache"):
        model(tokens, cache=object())
    with pytest.raises(ValueError, match="MHLA1d was built for 1..64 tokens, got 65"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="hidden_size=30 is not divisible by num_attention_heads=4"):
        MHLAConfig(hidden_size=30, num_attention_heads=4)


def small_llama(attention="sdpa", layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                         bos_token_id=None, eos_token_id=None)  # no end token: generate runs its full length
    config._attn_implementation = attention
    return LlamaForCausalLM(config).eval()


def test_each_swapped_layer_is_the_packages_mhla1d_from_the_same_weights():
    from mhla.transformers import MHLALlamaAttention
    llama = small_llama()
    attention = llama.model.layers[0].self_attn
    swapped = MHLALlamaAttention.from_attention(attention, block_size=8, max_tokens=48)
    # The same layer built by hand: k and v of each of the 2 key/value heads serve 2 query heads.
    torch.manual_seed(5)
    hand = mt.MHLA1d(32, 4, block_size=8, max_tokens=48, causal=True, bias=False)
    with torch.no_grad():
        hand.q_proj.weight.copy_(attention.q_proj.weight)
        hand.out_proj.weight.copy_(attention.o_proj.weight)
        for mine, theirs in ((hand.k_proj, attention.k_proj), (hand.v_proj, attention.v_proj)):
            mine.weight.copy_(theirs.weight.reshape(2, 1, 8, 32).expand(2, 2, 8, 32).reshape(32, 32))
        hand.mixing.logits.copy_(swapped.layer.mixing.logits)
    x = torch.randn(2, 40, 32, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    out, weights = swapped(hidden_states=x)
    assert weights is None
    want = hand(y)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)
    for (name, mine), (_, theirs) in zip(swapped.layer.named_parameters(), hand.named_parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_swapped_llama_fine_tunes_and_generates(attention):
    from mhla.transformers import MHLALlamaAttention, swap_llama_attention
    model = swap_llama_attention(small_llama(attention), block_size=8, layers=[0])
    assert isinstance(model.model.layers[0].self_attn, MHLALlamaAttention)
    assert not isinstance(model.model.layers[1].self_attn, MHLALlamaAttention)  # a hybrid
    tokens = torch.arange(40).remainder(5).repeat(3, 1)
    losses = train(model.train(), tokens, steps=15)
    assert losses[-1] < 0.5 * losses[0], losses
    model.eval()
    prompt = tokens[:1, :6]
    generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    sequence = prompt
    with torch.no_grad():
        for _ in range(8):
            sequence = torch.cat([sequence, model(sequence).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, sequence)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_swap_refuses_what_it_cannot_honour(attention):
    from mhla.transformers import swap_llama_attention
    model = swap_llama_attention(small_llama(attention), block_size=8)
    tokens = torch.randint(0, 61, (2, 10))
    padded = torch.ones(2, 10, dtype=torch.long)
    padded[0, :3] = 0
    with pytest.raises(ValueError, match="takes no padding"):
        model(tokens, attention_mask=padded)
    from transformers import DynamicCache
    with pytest.raises(ValueError, match="keeps no key/value cache: run the model with use_cache=False"):
        model(tokens, cache=DynamicCache(config=model.config), use_cache=True)
    with pytest.raises(ValueError, match="layer index 5 is out of range for 2 layers"):
        swap_llama_attention(small_llama(attention), block_size=8, layers=[5])
    with pytest.raises(ValueError, match="has no model.layers"):
        swap_llama_attention(torch.nn.Linear(2, 2), block_size=8)
