"""Fake step models for decode-loop tests: position-dependent 2nd-order Markov chains.

A `MarkovModel` predicts decoder token i+1 from (position i, token i - 1, token i) with a logits
table, so the exact distribution of any output prefix is a product of table rows: the tests
enumerate it. Token i - 1 is read from the model's cache, like a KV cache: a loop that forgets
to feed a token, or rewinds wrongly, changes the outputs.
"""

import dataclasses
import itertools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling as sampling_lib


@flax.struct.dataclass
class FakeCache:
  tokens: jax.Array  # int32[B, S] decoder inputs written so far (stale past end_index)
  end_index: jax.Array  # int32[B]


@dataclasses.dataclass(frozen=True)
class MarkovSteps:
  vocab_size: int
  start_id: int = 0
  eos_id: int = 1

  def encode(self, params, input_ids, input_mask):
    del params, input_mask
    return input_ids

  def init_cache(self, params, encoded, input_mask, max_decode_len):
    del params, input_mask
    batch = encoded.shape[0]
    return FakeCache(jnp.zeros((batch, max_decode_len), jnp.int32), jnp.zeros((batch,), jnp.int32))

  def step(self, params, tokens, cache):
    table = params['table']  # float32[P, V, V, V]: (position, token two back, last token) -> logits
    write = jax.vmap(lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,)))
    buffer = write(cache.tokens, tokens, cache.end_index)
    pos = cache.end_index[:, None] + jnp.arange(tokens.shape[1])
    two_back = jnp.take_along_axis(buffer, jnp.maximum(pos - 1, 0), axis=1)
    two_back = jnp.where(pos == 0, self.start_id, two_back)
    logits = table[jnp.minimum(pos, table.shape[0] - 1), two_back, tokens]
    return logits, FakeCache(buffer, cache.end_index + tokens.shape[1])


@dataclasses.dataclass
class MarkovModel:
  steps: MarkovSteps
  params: dict


def random_markov(
  seed: int, vocab_size: int = 4, positions: int = 8, eos_id: int = 1, scale: float = 1.5
) -> MarkovModel:
  shape = (positions, vocab_size, vocab_size, vocab_size)
  table = np.random.default_rng(seed).normal(size=shape) * scale
  return MarkovModel(MarkovSteps(vocab_size, 0, eos_id), {'table': jnp.asarray(table, jnp.float32)})


def exact_prefix_distribution(
  model: MarkovModel, length: int, sampling: sampling_lib.SamplingConfig, pad_id: int = 0
) -> dict:
  """{(y_1..y_length): probability} of generate(model) output, EOS absorbing into PAD."""
  probs = np.asarray(sampling_lib.logits_to_probs(model.params['table'], sampling), np.float64)
  probs /= probs.sum(-1, keepdims=True)
  v, eos = model.steps.vocab_size, model.steps.eos_id
  dist = {}
  for seq in itertools.product(range(v), repeat=length):
    start = model.steps.start_id
    prob, two_back, prev, ended = 1.0, start, start, False
    for i, y in enumerate(seq):
      if ended:
        prob *= float(y == pad_id)
        continue
      prob *= probs[min(i, probs.shape[0] - 1), two_back, prev, y]
      two_back, prev, ended = prev, y, y == eos
    if prob > 0:
      dist[seq] = prob
  return dist
