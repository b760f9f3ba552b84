"""The Gemma 4 assistant (`config.gemma.GemmaAssistantConfig`): one draft step over the
K/V a Gemma 4 target has cached.

transformers' `Gemma4AssistantForCausalLM`. A draft step for row b at position p_b (the
slot of the last token t the target has not cached yet), with h the target's final state
that predicted t, or the previous step's carried state::

    x      = pre_projection([embed_target(t), h])            [B, 2 E_t] -> [B, E]
    x      = layers(x)      query-only attention at position p over the target's K/V,
                            gated MLP, Gemma 4's norms and layer scalars
    s      = final norm(x)
    logits = s @ embedding^T                                 tied, not soft-capped;
             with centroids only the tokens of the top-k centroids, the others -inf
    h'     = post_projection(s)                              [B, E_t]: the next step's h

Each layer reads the target's LAST layer of its own type (sliding or full): full layers
the keys at slots [0, p), sliding layers [p - window - 1, p) (transformers' mask for the
assistant keeps the keys within distance window of the query, both ends included). The
position stays p for every draft of a round: the assistant caches nothing, it carries h'
instead. transformers fills
the masked logits with the least kept logit of the whole batch minus 1 (a value that
depends on the other rows); -inf keeps each row's distribution its own, and greedy drafts
are the same either way.

Parameter tree::

    pre_projection/kernel                    [2 E_t, E]
    post_projection/kernel                   [E, E_t]
    token_embedder/embedding                 [V, E]         (the tied output layer)
    decoder/layers_i/{pre,post}_self_attention_layer_norm/scale             [E]
    decoder/layers_i/{pre,post}_mlp_layer_norm/scale                        [E]
    decoder/layers_i/self_attention/{query, out}/kernel, .../query_norm/scale
    decoder/layers_i/mlp/{wi_0, wi_1, wo}/kernel, decoder/layers_i/layer_scalar
    decoder/decoder_norm/scale                                              [E]
    centroids/kernel [E, C], token_ordering [V] int32       (with centroids only)
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp

from specdec_jax.config.gemma import GemmaAssistantConfig
from specdec_jax.models import lm
from specdec_jax.models.gemma import GemmaAttention
from specdec_jax.models.layers import (
  NORM_SCALE_INIT,
  Dense,
  Embed,
  Keys,
  MlpBlock,
  RMSNorm,
)

Array = jax.Array


class QueryAttention(GemmaAttention):
  """`GemmaAttention` without keys or values of its own: queries (normed per head) attend
  to K/V computed elsewhere (the target's cache)."""

  def setup(self):
    joined = self.num_heads * self.head_dim
    self.query = Dense(self.in_features, joined, ("embed", "joined_kv"), self.dtype)
    self.out = Dense(joined, self.in_features, ("joined_kv", "embed"), self.dtype)
    self.query_norm = RMSNorm(self.epsilon, self.dtype, axis="kv")

  def project_q(self, x: Array) -> Array:
    """[B, T, E] -> normed queries [B, H, T, Dh] (not yet rotated)."""
    return self.query_norm(self._split(self.query(x)))


class AssistantLayer(nn.Module):
  """transformers' `Gemma4TextDecoderLayer` with all its K/V shared: norm -> query-only
  attention -> norm, residual; norm -> gated MLP -> norm, residual; times its scalar."""

  config: GemmaAssistantConfig
  index: int

  def setup(self):
    cfg = self.config.decoder
    dt = cfg.activation_dtype
    heads, head_dim = cfg.layer_shape(self.index)
    norm = functools.partial(RMSNorm, cfg.norm_epsilon, dt)
    self.pre_self_attention_layer_norm = norm()
    self.self_attention = QueryAttention(cfg.num_heads, head_dim, cfg.emb_dim, dt,
                                         num_kv_heads=heads, query_init_scale=1.0,
                                         logit_softcap=cfg.attn_logit_softcap,
                                         epsilon=cfg.norm_epsilon)
    self.post_self_attention_layer_norm = norm()
    self.pre_mlp_layer_norm = norm()
    self.mlp = MlpBlock(cfg.mlp_dim, lm.mlp_activations(cfg.mlp), gelu_approximate=True,
                        dtype=dt)
    self.post_mlp_layer_norm = norm()
    self.layer_scalar = self.param("layer_scalar",
                                   nn.with_logical_partitioning(NORM_SCALE_INIT, (None,)),
                                   (1,), jnp.float32)

  def __call__(self, x: Array, k: Array, v: Array, position: Array, capacity: int) -> Array:
    """x [B, 1, E], the target's K/V [B, Hkv, C, Dh], position [B] -> [B, 1, E]."""
    cfg = self.config.decoder
    full = cfg.layer_types[self.index] == "full"
    theta, fraction, head_dim = ((cfg.global_rope_theta, cfg.global_rope_fraction,
                                  cfg.global_head_dim) if full else
                                 (cfg.rope_theta, cfg.rope_fraction, cfg.head_dim))
    rope = lm.rope_tables(position[:, None], head_dim, theta, capacity, fraction)
    attention = self.self_attention
    q = lm.apply_rope(attention.project_q(self.pre_self_attention_layer_norm(x)), *rope)
    # the slots before p; a sliding layer's last window + 1 of them (transformers' mask
    # for the assistant keeps keys within distance <= window of the query's)
    keys = Keys(position[:, None].astype(jnp.int32),
                window=None if full else cfg.sliding_window + 1)
    x = x + self.post_self_attention_layer_norm(attention.attend(q, k, v, keys))
    x = x + self.post_mlp_layer_norm(self.mlp(self.pre_mlp_layer_norm(x)))
    return x * jnp.asarray(self.layer_scalar, x.dtype)


class AssistantDecoder(nn.Module):
  """The layers and the final norm."""

  config: GemmaAssistantConfig

  def setup(self):
    cfg = self.config
    self.layers = [AssistantLayer(cfg, i, name=f"layers_{i}")
                   for i in range(cfg.decoder.num_layers)]
    self.decoder_norm = RMSNorm(cfg.decoder.norm_epsilon, cfg.activation_dtype)

  def __call__(self, x: Array, kv: tuple, position: Array, capacity: int) -> Array:
    for layer, (k, v) in zip(self.layers, kv, strict=True):
      x = layer(x, k, v, position, capacity)
    return self.decoder_norm(x)


class GemmaAssistantModule(nn.Module):
  """One draft step (see the module docstring)."""

  config: GemmaAssistantConfig

  def setup(self):
    cfg = self.config
    dec, dt = cfg.decoder, cfg.activation_dtype
    self.pre_projection = Dense(2 * cfg.backbone_dim, dec.emb_dim, ("mlp", "embed"), dt)
    self.post_projection = Dense(dec.emb_dim, cfg.backbone_dim, ("embed", "mlp"), dt)
    self.token_embedder = Embed(dec.vocab_size, dec.emb_dim, dt)
    self.decoder = AssistantDecoder(cfg)
    if cfg.num_centroids is not None:
      self.centroids = Dense(dec.emb_dim, cfg.num_centroids, ("embed", "vocab"), jnp.float32)
      self.token_ordering = self.param("token_ordering", nn.initializers.zeros_init(),
                                       (dec.vocab_size,), jnp.int32)

  def __call__(self, inputs: Array, kv: tuple, position: Array, capacity: int
               ) -> tuple[Array, Array]:
    """inputs [B, 2 E_t] ([target embedding, target state]), per layer the target's
    (K, V) [B, Hkv, C, Dh], position [B] -> (logits float32 [B, V], h' [B, E_t])."""
    x = self.pre_projection(inputs.astype(self.config.activation_dtype)[:, None])
    s = self.decoder(x, kv, position, capacity)[:, 0]                      # [B, E]
    return self.logits(s), self.post_projection(s)

  def logits(self, s: Array) -> Array:
    """Final states [B, E] -> float32 [B, V]: every token's, or with centroids only the
    tokens of the `centroid_top_k` best centroids' blocks of `token_ordering` (-inf
    elsewhere), computed for those tokens alone."""
    cfg = self.config
    s = s.astype(jnp.float32)
    if cfg.num_centroids is None:
      return self.token_embedder.attend(s)
    _, top = jax.lax.top_k(self.centroids(s), cfg.centroid_top_k)          # [B, k]
    blocks = self.token_ordering.reshape(cfg.num_centroids, -1)            # [C, V / C]
    chosen = jnp.take(blocks, top, axis=0).reshape(s.shape[0], -1)          # [B, k V / C]
    table = jnp.asarray(self.token_embedder.embedding, jnp.float32)
    kept = jnp.einsum("be,bke->bk", s, jnp.take(table, chosen, axis=0))
    rows = jnp.arange(s.shape[0])[:, None]
    masked = jnp.full((s.shape[0], cfg.vocab_size), -jnp.inf, jnp.float32)
    return masked.at[rows, chosen].set(kept)


@functools.lru_cache(maxsize=None)
def module_for(config: GemmaAssistantConfig) -> GemmaAssistantModule:
  return GemmaAssistantModule(config)


def step(config: GemmaAssistantConfig, params: Any, inputs: Array, kv: tuple, position: Array,
         capacity: int) -> tuple[Array, Array]:
  """One draft step of the assistant (`GemmaAssistantModule.__call__`), traced in place."""
  out: tuple[Array, Array] = module_for(config).apply(  # type: ignore[assignment]
      {"params": params}, inputs, kv, position, capacity)
  return out


def param_shapes(config: GemmaAssistantConfig) -> dict[str, tuple[int, ...]]:
  """Flat "/"-joined parameter name -> shape of every parameter `config` implies."""
  dec = config.decoder
  batch, capacity = 1, 1
  kv = tuple((jnp.zeros((batch, h, capacity, d), dec.activation_dtype),) * 2
             for h, d in map(dec.layer_shape, range(dec.num_layers)))
  init = functools.partial(module_for(config).init, capacity=capacity)
  abstract = nn.unbox(jax.eval_shape(
      init, jax.random.PRNGKey(0), jnp.zeros((batch, 2 * config.backbone_dim)), kv,
      jnp.zeros((batch,), jnp.int32))["params"])
  return {"/".join(path): tuple(leaf.shape)
          for path, leaf in flax.traverse_util.flatten_dict(abstract).items()}
