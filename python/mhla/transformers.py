"""MHLA language models for Hugging Face ``transformers`` (tested with 5.24).

- ``MHLAConfig`` and ``MHLAForCausalLM``: a decoder-only language model of
  pre-norm blocks (RMSNorm, causal ``mhla.torch.MHLA1d``, RMSNorm, SwiGLU MLP),
  registered with ``AutoConfig`` and ``AutoModelForCausalLM`` as model type
  ``"mhla"``, so ``save_pretrained`` / ``from_pretrained`` work as for any model.
- ``generate()`` runs on the layers' streaming decoders (``MHLA1d.new_cache``):
  the prompt is prefilled in blocks, then each new token costs O(1), whatever
  the length so far. ``model(ids)`` without a cache is the ordinary parallel
  forward, which trains.
- ``swap_llama_attention``: the self-attention of an existing Llama-style model
  (``LlamaForCausalLM`` and the models whose attention has its
  ``q_proj``/``k_proj``/``v_proj``/``o_proj``) turned into causal MHLA started from
  its weights, for fine-tuning as the paper converts softmax models.

Importing this module registers the model type; ``transformers`` is needed only here.
"""
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .torch import MHLA1d, RMSNorm

__all__ = ["MHLAConfig", "MHLAForCausalLM", "MHLALanguageModelCache", "MHLALlamaAttention", "swap_llama_attention"]


@dataclass(repr=False)
class MHLAConfig(PreTrainedConfig):
    """Sizes of an ``MHLAForCausalLM``. ``block_size`` is MHLA's block of tokens; the mixing
    matrix covers ``max_position_embeddings`` tokens (``max_position_embeddings / block_size`` blocks)."""

    model_type = "mhla"

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int | None = None  # 8/3 hidden_size rounded up to 8, as SwiGLU models use
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    block_size: int = 16
    max_position_embeddings: int = 512
    feature_map: str = "elu1"
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if self.intermediate_size is None:
            self.intermediate_size = (8 * self.hidden_size // 3 + 7) // 8 * 8
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.block_size <= 0 or self.max_position_embeddings <= 0:
            raise ValueError("block_size and max_position_embeddings must be positive, got "
                             f"{self.block_size} and {self.max_position_embeddings}")
        super().__post_init__(**kwargs)


class MHLALanguageModelCache:
    """What ``generate`` carries between steps of an ``MHLAForCausalLM``: one ``MHLA1dCache``
    per layer. A linear-attention cache in ``transformers``' terms: a fixed-size state, never
    sliced or cropped."""

    is_compileable = False
    is_croppable = False

    def __init__(self, layers):
        self.layers = layers
        self.is_linear = [True] * len(layers)

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].position(0)


class _SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attention = MHLA1d(config.hidden_size, config.num_attention_heads, block_size=config.block_size,
                                max_tokens=config.max_position_embeddings, causal=True,
                                feature_map=config.feature_map, bias=False)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = _SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x, cache=None):
        a = self.attention_norm(x)
        x = x + (self.attention(a) if cache is None else self.attention.decode(a, cache))
        return x + self.mlp(self.mlp_norm(x))


class MHLAForCausalLM(PreTrainedModel, GenerationMixin):
    """A causal language model with MHLA attention; see the module's documentation."""

    config_class = MHLAConfig
    base_model_prefix = "mhla"
    _no_split_modules = ["_Block"]
    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the cache is the layers' decoders, made by forward

    def _init_weights(self, module):
        # Linear and embedding weights as transformers' models start them; MHLA's own
        # parameters (the mixing matrices) keep their locality initialisation.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, cache=None, use_cache=None, labels=None, attention_mask=None,
                inputs_embeds=None, position_ids=None, logits_to_keep=0, return_dict=True, **kwargs):
        """Logits of ``input_ids [B, N]`` (or ``inputs_embeds [B, N, hidden]``).

        With ``use_cache=True`` (as ``generate`` passes) or a ``cache``, the tokens continue the
        cache's sequences through the streaming decoders, under ``torch.no_grad``, and the
        output's ``cache`` holds them; otherwise the parallel forward runs (``use_cache`` is
        off unless asked for, so training never meets the decoders). ``position_ids`` are
        accepted as ``generate`` passes them and must count the tokens from the sequence's
        first (from the cache's length when decoding); others are refused, since MHLA's
        positions are its blocks. Padding in ``attention_mask`` is refused: pass sequences
        of one length.
        """
        if kwargs:
            raise TypeError(f"MHLAForCausalLM.forward got unsupported arguments: {', '.join(sorted(kwargs))}")
        if attention_mask is not None and not bool(torch.all(attention_mask == 1)):
            raise ValueError("MHLAForCausalLM takes no padding: attention_mask must be all ones (MHLA's blocks "
                             "are positions in the sequence, so pad tokens would move them); pass sequences of "
                             "one length")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if cache is not None and not isinstance(cache, MHLALanguageModelCache):
            raise TypeError(f"cache must be the MHLALanguageModelCache a previous call returned, "
                            f"not {type(cache).__name__}")
        decoding = cache is not None or bool(use_cache)
        if decoding:
            if cache is None:
                cache = MHLALanguageModelCache([layer.attention.new_cache(x.shape[0]) for layer in self.layers])
            _check_positions(position_ids, x.shape[1], cache.get_seq_length())
            for layer, layer_cache in zip(self.layers, cache.layers):
                x = layer(x, layer_cache)
        else:
            _check_positions(position_ids, x.shape[1], 0)
            for layer in self.layers:
                x = layer(x)
        hidden = self.norm(x)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if decoding else None)
        return out if return_dict else out.to_tuple()


def _check_positions(position_ids, tokens, seen):
    """``position_ids`` (``[B, N]`` or ``[N]``) must be ``seen, seen + 1, ...`` in every row."""
    if position_ids is None:
        return
    expected = torch.arange(seen, seen + tokens, device=position_ids.device)
    if position_ids.shape[-1] != tokens or not bool(torch.all(position_ids == expected)):
        first = position_ids.reshape(-1)[:4].tolist()
        held = f"; the cache holds {seen} tokens" if seen else ""
        raise ValueError(f"position_ids must count the tokens from {seen} ({seen}, {seen + 1}, ...{held}), got "
                         f"{first}{' ...' if position_ids.numel() > 4 else ''}: MHLA's positions are its blocks, so "
                         "other positions cannot be honoured")


AutoConfig.register(MHLAConfig.model_type, MHLAConfig)
AutoModelForCausalLM.register(MHLAConfig, MHLAForCausalLM)


class MHLALlamaAttention(nn.Module):
    """A Llama-style attention's place taken by a causal ``MHLA1d`` (``.layer``), with the attention's
    call signature: ``forward(hidden_states, position_embeddings, attention_mask, cache, **kwargs)``
    returns ``(output, None)``. MHLA's positions are its blocks, so the rotary embedding is not used."""

    def __init__(self, layer, layer_idx):
        super().__init__()
        self.layer = layer
        self.layer_idx = layer_idx

    @classmethod
    def from_attention(cls, attention, *, block_size, max_tokens, **options):
        """The MHLA layer with q, k, v and o projections copied from ``attention`` (grouped k and v
        heads repeated to every query head); ``options`` go to ``MHLA1d``."""
        config = attention.config
        heads, head_dim = config.num_attention_heads, attention.head_dim
        groups = heads // config.num_key_value_heads
        layer = MHLA1d(config.hidden_size, heads, head_dim=head_dim, block_size=block_size, max_tokens=max_tokens,
                       causal=True, bias=attention.q_proj.bias is not None, **options)
        layer = layer.to(device=attention.q_proj.weight.device, dtype=attention.q_proj.weight.dtype)

        def per_query_head(weight):  # [kv_heads * d, ...] -> [heads * d, ...]
            shape = weight.shape
            return weight.reshape(-1, 1, head_dim, *shape[1:]).expand(-1, groups, head_dim, *shape[1:]) \
                .reshape(heads * head_dim, *shape[1:])

        with torch.no_grad():
            for mine, theirs, expand in ((layer.q_proj, attention.q_proj, False), (layer.k_proj, attention.k_proj, True),
                                         (layer.v_proj, attention.v_proj, True), (layer.out_proj, attention.o_proj, False)):
                mine.weight.copy_(per_query_head(theirs.weight) if expand else theirs.weight)
                if theirs.bias is not None:
                    mine.bias.copy_(per_query_head(theirs.bias) if expand else theirs.bias)
        return cls(layer, attention.layer_idx)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        if cache is not None:
            raise ValueError("the swapped MHLA attention keeps no key/value cache: run the model with "
                             "use_cache=False (swap_llama_attention sets it in config and generation_config)")
        if attention_mask is not None and not _is_causal(attention_mask):
            raise ValueError("the swapped MHLA attention takes no padding or other masks than the causal one: "
                             "pass sequences of one length")
        return self.layer(hidden_states), None


def _is_causal(mask):
    """Whether a 4D attention mask (boolean, or additive floats) lets each query see exactly the keys up to it."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    n, m = allowed.shape[-2:]
    causal = torch.ones(n, m, dtype=torch.bool, device=mask.device).tril(m - n)
    return bool(torch.equal(allowed, causal.expand_as(allowed)))


def swap_llama_attention(model, *, block_size, layers=None, **options):
    """Replaces the self-attention of ``model`` (a ``LlamaForCausalLM`` or a model of the same
    layout: ``model.model.layers[i].self_attn``) with ``MHLALlamaAttention`` started from its
    weights, in place; returns the model. ``layers`` lists the layer indices to swap (all by
    default; the paper's hybrids keep some softmax layers). The mixing matrix covers
    ``config.max_position_embeddings`` tokens in blocks of ``block_size``. ``options`` go to
    ``MHLA1d`` (for example ``feature_map``). The swapped layers keep no key/value cache, so the
    model's ``use_cache`` is turned off: ``generate()`` recomputes the sequence each step.
    """
    decoder = getattr(model, "model", None)
    blocks = getattr(decoder, "layers", None)
    if blocks is None or not all(hasattr(b, "self_attn") for b in blocks):
        raise ValueError(f"{type(model).__name__} has no model.layers[i].self_attn: swap_llama_attention takes "
                         "Llama-style causal language models")
    chosen = range(len(blocks)) if layers is None else list(layers)
    for i in chosen:
        if not 0 <= i < len(blocks):
            raise ValueError(f"layer index {i} is out of range for {len(blocks)} layers")
        attention = blocks[i].self_attn
        missing = [name for name in ("q_proj", "k_proj", "v_proj", "o_proj") if not hasattr(attention, name)]
        if missing:
            raise ValueError(f"layer {i}'s attention ({type(attention).__name__}) has no {', '.join(missing)}")
        blocks[i].self_attn = MHLALlamaAttention.from_attention(
            attention, block_size=block_size, max_tokens=model.config.max_position_embeddings, **options)
    model.config.use_cache = False
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False
    return model
