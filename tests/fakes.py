"""Fake step models for decode-loop tests: position-dependent 2nd-order Markov chains.

A `MarkovModel` predicts decoder token i+1 from (position i, token i - 1, token i) with a logits
table, so the exact distribution of any output prefix is a product of table rows: the tests
enumerate it. Token i - 1 is read from the model's cache, like a KV cache: a loop that forgets
to feed a token, or rewinds wrongly, changes the outputs.

At the end, the models the decode tests share (TARGET, DRAFTER, GREEDY_TARGET, STATE_TARGET and
the block drafter BLOCK) and their samplers (`speculative_prefixes`, `sequence_pvalue`).
"""

import dataclasses
import itertools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from tests import chisquare


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

  def step_tree(self, params, tree, cache, max_depth, return_states=False):
    """A pass over a token tree (`trees.Tree`) written at slots end_index + u: node u is at
    position end_index + depth, its token two back its parent's (before the root: the cache's
    last token). Returns (logits [B, N, V], [one-hot states,] cache with end_index unchanged)."""
    del max_depth
    write = jax.vmap(lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,)))
    end = cache.end_index
    buffer = write(cache.tokens, tree.tokens, end)
    before_root = jnp.take_along_axis(cache.tokens, jnp.maximum(end - 1, 0)[:, None], axis=1)
    before_root = jnp.where(end[:, None] == 0, self.start_id, before_root)
    parent_token = jnp.take_along_axis(tree.tokens, jnp.maximum(tree.parents, 0), axis=1)
    two_back = jnp.where(tree.parents >= 0, parent_token, before_root)
    table = params['table']
    pos = end[:, None] + tree.depth
    logits = table[jnp.minimum(pos, table.shape[0] - 1), two_back, tree.tokens]
    states = (jax.nn.one_hot(tree.tokens, self.vocab_size),) if return_states else ()
    return (logits, *states, FakeCache(buffer, end))

  def keep_path(self, cache, path, num_accepted):
    """After `step_tree`: the accepted nodes' tokens moved after the root, end_index + 1 + tau."""
    end = cache.end_index
    slots = end[:, None] + jnp.where(path >= 0, path, 1 + jnp.arange(path.shape[1]))
    moved = jnp.take_along_axis(cache.tokens, slots, axis=1)
    write = jax.vmap(lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,)))
    return FakeCache(write(cache.tokens, moved, end + 1), end + 1 + num_accepted)


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


# ---------------------------------------------------------------------------------------------
# A target that gives its states, and a block drafter reading them.


@dataclasses.dataclass(frozen=True)
class MarkovStateSteps(MarkovSteps):
  """A `MarkovSteps` target that also returns states: the one-hot vector of each input token
  (state_dim = V), which a drafter reading the target's states sees at the next position."""

  @property
  def state_dim(self):
    return self.vocab_size

  def step_states(self, params, tokens, cache):
    logits, cache = self.step(params, tokens, cache)
    return logits, jax.nn.one_hot(tokens, self.vocab_size), cache


@dataclasses.dataclass(frozen=True)
class BlockSteps(MarkovSteps):
  """A fake block drafter (`block_size`, `step_block`) whose positions' laws differ.

  Draft j (1-based) of a block after the pending token x_n at position n has the logits
  table[min(n, P-1), x_{n-1}, x_n, j - 1] + weight[j - 1] * (the target's state before x_n), with
  x_{n-1} read from the drafter's own cache (so a loop that catches it up wrongly changes the
  drafts) and the state from the loop's features (so misaligned states change them too). Draft j
  depends on the kept prefix only, not on drafts 1..j - 1.
  """

  block_size: int = 3
  reads_target_states = True

  @property
  def feature_dim(self):
    return self.vocab_size

  def step(self, params, tokens, cache):
    raise ValueError('a block drafter drafts only inside speculative_generate')

  def step_block(self, params, tokens, features, cache, gamma, num_kept):
    if gamma > self.block_size:
      raise ValueError(f'gamma={gamma} exceeds block_size={self.block_size}')
    write = jax.vmap(lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,)))
    buffer = write(cache.tokens, tokens, cache.end_index)
    pending = cache.end_index + num_kept - 1  # the pending token's position
    token = jnp.take_along_axis(buffer, pending[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(buffer, jnp.maximum(pending - 1, 0)[:, None], axis=1)[:, 0]
    before = jnp.where(pending == 0, self.start_id, before)
    state = jnp.take_along_axis(features, (num_kept - 1)[:, None, None], axis=1)[:, 0]  # [B, F]
    table = params['table']  # [P, V, V, G, V]
    logits = table[jnp.minimum(pending, table.shape[0] - 1), before, token][:, :gamma]
    logits = logits + jnp.einsum('bf,gfv->bgv', state, params['weight'][:gamma])
    return logits, FakeCache(buffer, cache.end_index + num_kept)


def random_block_drafter(
  seed: int, vocab_size: int = 4, positions: int = 8, block_size: int = 3, scale: float = 1.5
) -> MarkovModel:
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(positions, vocab_size, vocab_size, block_size, vocab_size)) * scale
  weight = rng.normal(size=(block_size, vocab_size, vocab_size)) * scale
  params = {'table': jnp.asarray(table, jnp.float32), 'weight': jnp.asarray(weight, jnp.float32)}
  return MarkovModel(BlockSteps(vocab_size, 0, 1, block_size=block_size), params)


def with_states(model: MarkovModel) -> MarkovModel:
  """The same Markov chain as a target that also returns its states (`MarkovStateSteps`)."""
  s = model.steps
  return MarkovModel(MarkovStateSteps(s.vocab_size, s.start_id, s.eos_id), model.params)


# ---------------------------------------------------------------------------------------------
# The Markov models the decode tests share, and samples of their first tokens.

TARGET = random_markov(seed=1)
DRAFTER = random_markov(seed=2)
# For greedy parity: TARGET's greedy output is EOS at once, this one's runs past 12 tokens.
GREEDY_TARGET = random_markov(seed=10)
STATE_TARGET = with_states(TARGET)  # TARGET's law, with states for the drafter to read
BLOCK = random_block_drafter(seed=5)

PREFIX_ROWS, PREFIX_LENGTH = 100_000, 3


def speculative_prefixes(drafter, verifier, sampling, *, gamma, seed, **kw):
  """PREFIX_ROWS speculative samples of the first PREFIX_LENGTH tokens from TARGET, and stats;
  `kw` goes to `speculative_generate` (e.g. num_drafts, draft_stop)."""
  ids = jnp.zeros((PREFIX_ROWS, 1), jnp.int32)
  out = decode.speculative_generate(
    TARGET,
    drafter,
    ids,
    jnp.ones_like(ids),
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=PREFIX_LENGTH,
    rng=jax.random.key(seed),
    **kw,
  )
  return np.asarray(out.tokens), out.stats


# Whole sequences: the first 4 tokens, one to four iterations a row at gamma 2.
SEQUENCE_ROWS, SEQUENCE_LENGTH = 100_000, 4


def sequence_pvalue(tokens, sampling=sampling_lib.SamplingConfig(temperature=1.0)):
  """`chisquare.rows_pvalue` of SEQUENCE_LENGTH-token rows against TARGET's exact law; 0 for a
  row the target cannot produce."""
  exact = exact_prefix_distribution(TARGET, SEQUENCE_LENGTH, sampling)
  if set(map(tuple, tokens.tolist())) - set(exact):
    return 0.0  # an output the target cannot produce
  return chisquare.rows_pvalue(tokens, exact)
