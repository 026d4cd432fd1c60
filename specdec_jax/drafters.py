"""Drafters that are not a T5 model: n-gram tables.

Axis legend: B batch, T query length, L decoder positions, V vocab, K continuations kept per
context, C trigram contexts kept.

- A small T5 sharing the target's vocabulary is a drafter as it is (`T5Model.steps`).
- `NGramDrafter`: unigram / bigram (previous decoder token) / trigram (two previous tokens)
  drafters. Their step is a table lookup, so c ~ 0 in the paper's terms. Fitted on the *target's
  own outputs* rather than on references they agree with the target far more (the n-gram form of
  distillation; `scripts/fit_ngram.py --target=...`).
- The target itself is a valid drafter (alpha = 1): pass the same `T5Model` twice.
"""

import dataclasses
from collections.abc import Iterable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class NGramCache:
  """Unigram and bigram drafters need only the position count; a trigram also keeps the tokens
  fed so far, so that rewinding (lowering `end_index`) restores its context as for a KV cache."""

  end_index: jax.Array  # int32[B]
  history: jax.Array | None = None  # int32[B, L] token fed at each position (order 3 only)


@dataclasses.dataclass(frozen=True)
class NGramSteps:
  """Static half of an n-gram drafter: order 1 (unigram), 2 (bigram on the previous token) or 3
  (trigram on the two previous tokens, interpolated with the bigram)."""

  order: int
  vocab_size: int
  start_id: int = 0
  eos_id: int = 1

  def encode(self, params, input_ids, input_mask):
    """An n-gram drafter ignores the source; it only needs the batch size."""
    del params, input_mask
    return input_ids

  def init_cache(self, params, encoded, input_mask, max_decode_len: int) -> NGramCache:
    del params, input_mask
    b = encoded.shape[0]
    history = jnp.zeros((b, max_decode_len), jnp.int32) if self.order == 3 else None
    return NGramCache(end_index=jnp.zeros((b,), jnp.int32), history=history)

  def step(self, params, tokens, cache: NGramCache):
    """tokens int32[B, T] -> (log-probabilities float32[B, T, V], cache advanced by T)."""
    b, t = tokens.shape
    if self.order == 1:
      logits = jnp.broadcast_to(params['log_probs'], (b, t, self.vocab_size))
      return logits, cache.replace(end_index=cache.end_index + t)
    logits = _bigram_log_probs(params, tokens, self.vocab_size)
    if self.order == 2:
      return logits, cache.replace(end_index=cache.end_index + t)
    # Trigram: the token before each fed one comes from the history (this call's own tokens are
    # written first); position 0's predecessor is the start token, as in `fit`.
    positions = cache.end_index[:, None] + jnp.arange(t)
    rows = jnp.arange(b)[:, None]
    history = cache.history.at[rows, positions].set(tokens, mode='drop')
    before = jnp.take_along_axis(history, jnp.clip(positions - 1, min=0), axis=1)
    before = jnp.where(positions > 0, before, self.start_id)
    logits = _interpolate_trigram(params, before, tokens, logits)
    return logits, NGramCache(end_index=cache.end_index + t, history=history)


@dataclasses.dataclass
class NGramDrafter:
  """A fitted n-gram drafter: `steps` (static) and `params` (arrays), as the decode loops take.

  params (unigram): log_probs float32[V].
  params (bigram): log_base float32[V] (log-probability of an unlisted continuation, per context),
    next_ids int32[V, K] and next_log_probs float32[V, K] (the K most frequent continuations).
  params (trigram): the bigram's arrays, plus for the C contexts (x, y) seen at least
    `min_count` times, sorted by key x * V + y: tri_keys int32[C], tri_ids int32[C, K],
    tri_probs float32[C, K] (the K most frequent continuations, renormalised among themselves)
    and tri_weight float32[C], the Witten-Bell weight c / (c + distinct continuations) the
    trigram gets against the bigram.
  """

  steps: NGramSteps
  params: dict

  @classmethod
  def fit(
    cls,
    sequences: Iterable[np.ndarray],
    *,
    vocab_size: int,
    order: int = 2,
    add_k: float = 0.01,
    top_k: int = 64,
    min_count: int = 2,
    start_id: int = 0,
    eos_id: int = 1,
  ) -> 'NGramDrafter':
    """Counts n-grams of decoder token sequences and smooths them.

    p(y | x) = (c(x, y) + add_k) / (c(x) + add_k * V), where for a bigram only the `top_k` most
    frequent continuations of each context x are kept (the rest count as unseen; c(x) sums the
    kept counts), so the table is V x K, not V x V.

    Args:
      sequences: int arrays of target token ids (each ending with EOS, as the model emits them).
      vocab_size: V, the target's vocabulary size.
      order: 1 (unigram), 2 (bigram conditioned on the previous decoder token; the first token
        is conditioned on `start_id`) or 3 (trigram on the two previous tokens, the first on
        (start_id, start_id); interpolated with the bigram by Witten-Bell weights).
      add_k: additive smoothing constant, > 0 so every token has probability > 0.
      top_k: K, continuations kept per bigram (and trigram) context.
      min_count: a trigram context seen fewer times is left to the bigram (keeps the table small).
      start_id: the decoder start token.
      eos_id: the EOS token (for the step model's protocol).
    """
    if order not in (1, 2, 3):
      raise ValueError(f'order must be 1 (unigram), 2 (bigram) or 3 (trigram), got {order}.')
    if order == 3 and vocab_size**2 >= 2**31:
      raise ValueError(f'A trigram keys contexts as int32 x * V + y; V={vocab_size} is too large.')
    if add_k <= 0:
      raise ValueError(f'add_k must be > 0 so no token has zero probability, got {add_k}.')
    prev2, prev, nxt = [], [], []
    for seq in sequences:
      seq = np.asarray(seq, np.int64).reshape(-1)
      if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
        raise ValueError(
          f'Token ids must be in [0, {vocab_size}), got range [{seq.min()}, {seq.max()}].'
        )
      prev2.append(np.concatenate([[start_id, start_id], seq[:-2]])[: seq.size])
      prev.append(np.concatenate([[start_id], seq[:-1]]))
      nxt.append(seq)
    prev2, prev, nxt = (
      np.concatenate(x) if x else np.zeros(0, np.int64) for x in (prev2, prev, nxt)
    )
    steps = NGramSteps(order, vocab_size, start_id, eos_id)
    if order == 1:
      counts = np.bincount(nxt, minlength=vocab_size).astype(np.float64)
      probs = (counts + add_k) / (counts.sum() + add_k * vocab_size)
      return cls(steps, {'log_probs': jnp.asarray(np.log(probs), jnp.float32)})
    params = _fit_bigram(prev, nxt, vocab_size, add_k, top_k)
    if order == 3:
      params.update(_fit_trigram(prev2 * vocab_size + prev, nxt, top_k, min_count))
    return cls(steps, params)

  def save(self, path: str) -> None:
    """Writes a compressed .npz with the arrays and the static fields."""
    meta = dataclasses.asdict(self.steps)
    np.savez_compressed(
      path,
      **{k: np.asarray(v) for k, v in self.params.items()},
      **{f'meta_{k}': v for k, v in meta.items()},
    )

  @classmethod
  def load(cls, path) -> 'NGramDrafter':
    """Reads an .npz written by `save`.

    Raises:
      ValueError: naming the file and what is wrong, if it is not such an .npz: a `meta_*`
        field or a table is missing or unexpected, or a table has the wrong shape or dtype, or
        lists token ids outside the vocabulary. Loading a foreign file would otherwise fail
        later, or silently index out of range inside the jitted step.
    """
    contents = np.load(path)
    if not hasattr(contents, 'files'):
      raise ValueError(f'{path} holds a single .npy array, not an .npz of NGramDrafter.save.')
    with contents as f:
      arrays = {k: f[k] for k in f.files}
    steps = _checked_steps(path, {k[5:]: v for k, v in arrays.items() if k.startswith('meta_')})
    params = {k: v for k, v in arrays.items() if not k.startswith('meta_')}
    _check_tables(path, steps, params)
    return cls(steps, {k: jnp.asarray(v) for k, v in params.items()})


def _checked_steps(path, meta: dict) -> NGramSteps:
  """The `NGramSteps` of an .npz's `meta_*` fields (names without the prefix), checked."""
  fields = [field.name for field in dataclasses.fields(NGramSteps)]
  missing = [f'meta_{k}' for k in fields if k not in meta]
  unknown = sorted(f'meta_{k}' for k in set(meta) - set(fields))
  if missing or unknown:
    raise ValueError(
      f'{path} is not an .npz of NGramDrafter.save: missing fields {missing}, '
      f'unexpected fields {unknown}.'
    )
  bad = [
    f'meta_{k}' for k, v in meta.items() if v.shape != () or not np.issubdtype(v.dtype, np.integer)
  ]
  if bad:
    raise ValueError(f'{path}: {bad} must be integer scalars.')
  steps = NGramSteps(**{k: int(v) for k, v in meta.items()})
  if steps.order not in (1, 2, 3) or steps.vocab_size < 1:
    raise ValueError(
      f'{path}: meta_order must be 1, 2 or 3 and meta_vocab_size >= 1, got '
      f'{steps.order} and {steps.vocab_size}.'
    )
  return steps


def _check_tables(path, steps: NGramSteps, params: dict) -> None:
  """Raises ValueError unless `params` are the tables of an n-gram drafter of `steps`: names,
  shapes, dtypes, and token ids inside the vocabulary."""
  vocab = steps.vocab_size
  # name -> (shape, dtype kind); 'K' is the number of continuations kept per context.
  expected = (
    {'log_probs': ((vocab,), np.floating)}
    if steps.order == 1
    else {
      'log_base': ((vocab,), np.floating),
      'next_ids': ((vocab, 'K'), np.integer),
      'next_log_probs': ((vocab, 'K'), np.floating),
    }
  )
  if steps.order == 3:
    expected.update(
      tri_keys=(('C',), np.integer),
      tri_ids=(('C', 'K3'), np.integer),
      tri_probs=(('C', 'K3'), np.floating),
      tri_weight=(('C',), np.floating),
    )
  missing, unknown = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
  if missing or unknown:
    raise ValueError(
      f'{path}: an order-{steps.order} NGramDrafter needs the arrays '
      f'{sorted(expected)}; missing {missing}, unexpected {unknown}.'
    )
  for name, (shape, kind) in expected.items():
    got = params[name]
    if (
      got.ndim != len(shape)
      or any(s != g and not isinstance(s, str) for s, g in zip(shape, got.shape))
      or not np.issubdtype(got.dtype, kind)
    ):
      want = '[' + ', '.join(map(str, shape)) + ']'
      raise ValueError(
        f'{path}: array {name!r} must be {kind.__name__}{want} for '
        f'meta_vocab_size {vocab}, got {got.dtype}{list(got.shape)}.'
      )
  if steps.order >= 2:
    ids = params['next_ids']
    if ids.shape != params['next_log_probs'].shape:
      raise ValueError(
        f"{path}: 'next_ids' {list(ids.shape)} and 'next_log_probs' "
        f'{list(params["next_log_probs"].shape)} differ in K.'
      )
    if ids.size and not 0 <= ids.min() <= ids.max() < vocab:
      raise ValueError(f"{path}: 'next_ids' lists token ids outside [0, {vocab}).")
  if steps.order == 3:
    keys, ids = params['tri_keys'], params['tri_ids']
    if not (
      len(keys) == len(ids) == len(params['tri_weight']) and ids.shape == params['tri_probs'].shape
    ):
      raise ValueError(f'{path}: the tri_* arrays disagree in C or K.')
    if keys.size and (np.any(np.diff(keys) <= 0) or keys[0] < 0 or keys[-1] >= vocab**2):
      raise ValueError(f"{path}: 'tri_keys' must be strictly increasing in [0, V^2).")
    if ids.size and not 0 <= ids.min() <= ids.max() < vocab:
      raise ValueError(f"{path}: 'tri_ids' lists token ids outside [0, {vocab}).")


def _fit_bigram(
  prev: np.ndarray, nxt: np.ndarray, vocab_size: int, add_k: float, top_k: int
) -> dict:
  pair, counts = np.unique(prev * vocab_size + nxt, return_counts=True)
  ctx, tok = pair // vocab_size, pair % vocab_size
  # Within each context, most frequent first (ties: lower id first); keep the top K.
  order = np.lexsort((tok, -counts, ctx))
  ctx, tok, counts = ctx[order], tok[order], counts[order]
  rank = np.arange(len(ctx)) - np.searchsorted(ctx, ctx)
  keep = rank < top_k
  ctx, tok, counts, rank = ctx[keep], tok[keep], counts[keep], rank[keep]

  total = np.bincount(ctx, weights=counts, minlength=vocab_size)
  denom = total + add_k * vocab_size
  log_base = np.log(add_k / denom)
  # Unfilled slots repeat the context's first listed continuation (or id 0 at the base value),
  # so the scatter in `step` writes duplicates with identical values.
  next_ids = np.zeros((vocab_size, top_k), np.int64)
  next_log_probs = np.repeat(log_base[:, None], top_k, axis=1)
  has_any = np.zeros(vocab_size, bool)
  has_any[ctx] = True
  first = np.full(vocab_size, -1)
  first[ctx[rank == 0]] = np.nonzero(rank == 0)[0]
  next_ids[has_any] = tok[first[has_any]][:, None]
  next_log_probs[has_any] = np.log((counts[first[has_any]] + add_k) / denom[has_any])[:, None]
  next_ids[ctx, rank] = tok
  next_log_probs[ctx, rank] = np.log((counts + add_k) / denom[ctx])
  return {
    'log_base': jnp.asarray(log_base, jnp.float32),
    'next_ids': jnp.asarray(next_ids, jnp.int32),
    'next_log_probs': jnp.asarray(next_log_probs, jnp.float32),
  }


def _bigram_log_probs(params, tokens, vocab_size: int) -> jax.Array:
  """The bigram's log p(. | token): int32[B, T] -> float32[B, T, V]."""
  b, t = tokens.shape
  # Every continuation outside the K kept ones has the context's smoothing mass.
  logits = jnp.broadcast_to(params['log_base'][tokens][..., None], (b, t, vocab_size))
  rows, cols = jnp.arange(b)[:, None, None], jnp.arange(t)[None, :, None]
  return logits.at[rows, cols, params['next_ids'][tokens]].set(params['next_log_probs'][tokens])


def _interpolate_trigram(params, before, tokens, bigram_log_probs) -> jax.Array:
  """log((1 - w) p_bigram + w p_trigram) for contexts (before, tokens) in the table, else the
  bigram: int32[B, T] x 2, float32[B, T, V] -> float32[B, T, V]."""
  vocab = bigram_log_probs.shape[-1]
  keys = params['tri_keys']
  query = before * vocab + tokens
  # The binary search unrolled: the default method is a loop, and on a GPU each of its ~log2(n)
  # iterations is a round trip to the host (trigram c 0.30 of a target step on an H200).
  index = jnp.searchsorted(keys, query, method='scan_unrolled')
  index = jnp.clip(index, max=keys.shape[0] - 1)
  weight = jnp.where(keys[index] == query, params['tri_weight'][index], 0.0)[..., None]
  b, t = tokens.shape
  rows, cols = jnp.arange(b)[:, None, None], jnp.arange(t)[None, :, None]
  probs = (1.0 - weight) * jnp.exp(bigram_log_probs)
  probs = probs.at[rows, cols, params['tri_ids'][index]].add(weight * params['tri_probs'][index])
  return jnp.log(probs)


def _fit_trigram(context: np.ndarray, nxt: np.ndarray, top_k: int, min_count: int) -> dict:
  """Trigram tables (see `NGramDrafter`) from context keys x * V + y and next tokens."""
  pairs, counts = np.unique(np.stack([context, nxt]), axis=1, return_counts=True)
  ctx, tok = pairs
  keys, per_context = np.unique(ctx, return_inverse=True)
  total = np.bincount(per_context, weights=counts)  # c(x, y)
  types = np.bincount(per_context)  # distinct continuations of (x, y)
  keep = total >= min_count
  # Within each context, most frequent first (ties: lower id first); keep the top K.
  order = np.lexsort((tok, -counts, ctx))
  ctx, tok, counts = ctx[order], tok[order], counts[order]
  rank = np.arange(len(ctx)) - np.searchsorted(ctx, ctx)
  row = np.searchsorted(keys, ctx)
  kept = (rank < top_k) & keep[row]
  ids = np.zeros((len(keys), top_k), np.int64)
  probs = np.zeros((len(keys), top_k), np.float64)
  ids[row[kept], rank[kept]] = tok[kept]
  probs[row[kept], rank[kept]] = counts[kept]
  probs /= np.maximum(probs.sum(1, keepdims=True), 1)
  weight = total / (total + types)  # Witten-Bell
  return {
    'tri_keys': jnp.asarray(keys[keep], jnp.int32),
    'tri_ids': jnp.asarray(ids[keep], jnp.int32),
    'tri_probs': jnp.asarray(probs[keep], jnp.float32),
    'tri_weight': jnp.asarray(weight[keep], jnp.float32),
  }
