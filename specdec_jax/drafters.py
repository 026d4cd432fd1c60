"""Drafters that are not a T5 model: n-gram tables.

Axis legend: B batch, T query length, V vocab, K continuations kept per bigram context.

- A small T5 sharing the target's vocabulary is a drafter as it is (`T5Model.steps`).
- `NGramDrafter`: unigram / bigram (previous decoder token) drafters with add-k smoothing. Their
  step is a table lookup, so c ~ 0 in the paper's terms.
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
  """An n-gram drafter needs no history beyond the token it is fed; only the position count."""

  end_index: jax.Array  # int32[B]


@dataclasses.dataclass(frozen=True)
class NGramSteps:
  """Static half of an n-gram drafter: order 1 (unigram) or 2 (bigram on the previous token)."""

  order: int
  vocab_size: int
  start_id: int = 0
  eos_id: int = 1

  def encode(self, params, input_ids, input_mask):
    """An n-gram drafter ignores the source; it only needs the batch size."""
    del params, input_mask
    return input_ids

  def init_cache(self, params, encoded, input_mask, max_decode_len: int) -> NGramCache:
    del params, input_mask, max_decode_len
    return NGramCache(end_index=jnp.zeros((encoded.shape[0],), jnp.int32))

  def step(self, params, tokens, cache: NGramCache):
    """tokens int32[B, T] -> (log-probabilities float32[B, T, V], cache advanced by T)."""
    b, t = tokens.shape
    if self.order == 1:
      logits = jnp.broadcast_to(params['log_probs'], (b, t, self.vocab_size))
    else:
      # Every continuation outside the K kept ones has the context's smoothing mass.
      logits = jnp.broadcast_to(params['log_base'][tokens][..., None], (b, t, self.vocab_size))
      rows, cols = jnp.arange(b)[:, None, None], jnp.arange(t)[None, :, None]
      logits = logits.at[rows, cols, params['next_ids'][tokens]].set(
        params['next_log_probs'][tokens]
      )
    return logits, cache.replace(end_index=cache.end_index + t)


@dataclasses.dataclass
class NGramDrafter:
  """A fitted n-gram drafter: `steps` (static) and `params` (arrays), as the decode loops take.

  params (unigram): log_probs float32[V].
  params (bigram): log_base float32[V] (log-probability of an unlisted continuation, per context),
    next_ids int32[V, K] and next_log_probs float32[V, K] (the K most frequent continuations).
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
      order: 1 (unigram) or 2 (bigram conditioned on the previous decoder token; the first token
        is conditioned on `start_id`).
      add_k: additive smoothing constant, > 0 so every token has probability > 0.
      top_k: K, continuations kept per bigram context.
      start_id: the decoder start token.
      eos_id: the EOS token (for the step model's protocol).
    """
    if order not in (1, 2):
      raise ValueError(f'order must be 1 (unigram) or 2 (bigram), got {order}.')
    if add_k <= 0:
      raise ValueError(f'add_k must be > 0 so no token has zero probability, got {add_k}.')
    prev, nxt = [], []
    for seq in sequences:
      seq = np.asarray(seq, np.int64).reshape(-1)
      if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
        raise ValueError(
          f'Token ids must be in [0, {vocab_size}), got range [{seq.min()}, {seq.max()}].'
        )
      prev.append(np.concatenate([[start_id], seq[:-1]]))
      nxt.append(seq)
    prev = np.concatenate(prev) if prev else np.zeros(0, np.int64)
    nxt = np.concatenate(nxt) if nxt else np.zeros(0, np.int64)
    steps = NGramSteps(order, vocab_size, start_id, eos_id)
    if order == 1:
      counts = np.bincount(nxt, minlength=vocab_size).astype(np.float64)
      probs = (counts + add_k) / (counts.sum() + add_k * vocab_size)
      return cls(steps, {'log_probs': jnp.asarray(np.log(probs), jnp.float32)})
    return cls(steps, _fit_bigram(prev, nxt, vocab_size, add_k, top_k))

  def save(self, path: str) -> None:
    """Writes an .npz with the arrays and the static fields."""
    meta = dataclasses.asdict(self.steps)
    np.savez(
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
    fields = [field.name for field in dataclasses.fields(NGramSteps)]
    meta = {k[5:]: v for k, v in arrays.items() if k.startswith('meta_')}
    missing = [f'meta_{k}' for k in fields if k not in meta]
    unknown = sorted(f'meta_{k}' for k in set(meta) - set(fields))
    if missing or unknown:
      raise ValueError(
        f'{path} is not an .npz of NGramDrafter.save: missing fields {missing}, '
        f'unexpected fields {unknown}.'
      )
    bad = [
      f'meta_{k}'
      for k, v in meta.items()
      if v.shape != () or not np.issubdtype(v.dtype, np.integer)
    ]
    if bad:
      raise ValueError(f'{path}: {bad} must be integer scalars.')
    steps = NGramSteps(**{k: int(v) for k, v in meta.items()})
    if steps.order not in (1, 2) or steps.vocab_size < 1:
      raise ValueError(
        f'{path}: meta_order must be 1 or 2 and meta_vocab_size >= 1, got '
        f'{steps.order} and {steps.vocab_size}.'
      )
    params = {k: v for k, v in arrays.items() if not k.startswith('meta_')}
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
        or any(s not in ('K', g) for s, g in zip(shape, got.shape))
        or not np.issubdtype(got.dtype, kind)
      ):
        want = '[' + ', '.join(map(str, shape)) + ']'
        raise ValueError(
          f'{path}: array {name!r} must be {kind.__name__}{want} for '
          f'meta_vocab_size {vocab}, got {got.dtype}{list(got.shape)}.'
        )
    if steps.order == 2:
      ids = params['next_ids']
      if ids.shape != params['next_log_probs'].shape:
        raise ValueError(
          f"{path}: 'next_ids' {list(ids.shape)} and 'next_log_probs' "
          f'{list(params["next_log_probs"].shape)} differ in K.'
        )
      if ids.size and not 0 <= ids.min() <= ids.max() < vocab:
        raise ValueError(f"{path}: 'next_ids' lists token ids outside [0, {vocab}).")
    return cls(steps, {k: jnp.asarray(v) for k, v in params.items()})


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
