r"""Would a lookup drafter beat the trigram? Greedy speculative decoding simulated on the target's
own greedy outputs: tokens per target call of retrieval (REST-style) and source-copy drafters
against the shipped trigram, without building them into the loop.

  python -m benchmarks.lookup_drafters                  # pretrained/ende48m, 500 test sentences
  python -m benchmarks.lookup_drafters --num_sources=100 --gamma=5

At temperature 0 a draft token is accepted iff it equals the target's greedy token, so the
target's greedy output y of a source fixes every iteration: from position t the drafter proposes
gamma tokens (each conditioned on the ones before), the loop keeps the a that match y[t:] and
emits a + 1 tokens. The tokens per call give the alpha that the i.i.d. model would need for the
same value, E = (1 - alpha^(gamma+1)) / (1 - alpha). Drafters:

- trigram: the pair's `trigram.npz` (fitted on the target's greedy outputs), its argmax.
- datastore: the longest suffix (2-6 tokens) of the output so far that occurs in the references
  of the training split, followed by its most frequent continuation; else the trigram.
- retrieval k: the same, over the references of the k training pairs whose sources share the most
  idf-weighted tokens with this source, plus the source itself (copying names and numbers).
- source copy: over the source alone.

Past runs: docs/results.md section 3, "Lookup drafters, simulated".
"""

import collections
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from specdec_jax import analysis, decode
from specdec_jax.data import pairs
from specdec_jax.sampling import SamplingConfig

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'ende48m', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_TRAIN = flags.DEFINE_string(
  'train_file', 'data/ende/train.tsv', 'Datastore pairs.', flag_values=FLAGS
)
_VALID = flags.DEFINE_string(
  'valid_file', 'data/ende/valid.tsv', "'' to skip the valid split.", flag_values=FLAGS
)
_NUM = flags.DEFINE_integer(
  'num_sources', 500, 'Test sentences (and at most 256 valid ones).', flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.', flag_values=FLAGS)
_MAX_N = 6


class SuffixIndex:
  """Continuation counts of every 1.._MAX_N-token context of some token sequences."""

  def __init__(self, sequences):
    self.counts = collections.defaultdict(collections.Counter)
    for s in sequences:
      s = [0, *s]  # the decoder start token before the first
      for i in range(1, len(s)):
        for n in range(1, min(_MAX_N, i) + 1):
          self.counts[tuple(s[i - n : i])][s[i]] += 1

  def next(self, seq, min_n: int):
    """Most frequent continuation of the longest suffix of `seq` (>= min_n tokens) seen."""
    for n in range(min(_MAX_N, len(seq)), min_n - 1, -1):
      if c := self.counts.get(tuple(seq[-n:])):
        return c.most_common(1)[0][0]
    return None


class Retriever:
  """The k training pairs whose sources share the most idf-weighted (idf > 2) tokens."""

  def __init__(self, sources):
    df = collections.Counter(t for s in sources for t in set(s))
    self.idf = {t: math.log(len(sources) / n) for t, n in df.items()}
    self.index = collections.defaultdict(list)
    for i, s in enumerate(sources):
      for t in set(s):
        self.index[t].append(i)

  def __call__(self, source, k: int) -> list[int]:
    scores = collections.Counter()
    for t in set(source):
      if self.idf.get(t, 0.0) > 2.0:
        for i in self.index[t]:
          scores[i] += self.idf[t]
    return [i for i, _ in scores.most_common(k)]


def trigram_argmax(drafter):
  """(x, y) -> argmax p(. | x, y) of an order-3 `NGramDrafter`, one compiled call, memoised."""
  steps, params = drafter.steps, drafter.params

  @jax.jit
  def argmax(x, y):
    cache = steps.init_cache(params, jnp.zeros((1, 1), jnp.int32), None, 2)
    log_probs, _ = steps.step(params, jnp.stack([x, y])[None], cache)
    return jnp.argmax(log_probs[0, 1])

  return functools.cache(lambda x, y: int(argmax(x, y)))


def tokens_per_call(draft, sources, outputs, gamma: int) -> float:
  emitted = calls = 0
  for source, y in zip(sources, outputs):
    propose, t = draft(source), 0
    while t < len(y):
      d = propose(y[:t])
      a = 0
      while a < len(d) and t + a < len(y) and d[a] == y[t + a]:
        a += 1
      t, emitted, calls = t + a + 1, emitted + a + 1, calls + 1
  return emitted / calls


def equivalent_alpha(tokens: float, gamma: int) -> float:
  """The alpha whose `analysis.expected_tokens` at `gamma` is `tokens` (bisection)."""
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if analysis.expected_tokens(mid, gamma) < tokens else (lo, mid)
  return lo


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  pair, gamma = benchmarks.load_pair(_DIR.value), _GAMMA.value
  tok = pair.tokenizer
  tri = trigram_argmax(pair.drafters['trigram'])
  train = pairs.load_pairs(_TRAIN.value)
  train_src = [tok.encode(s, add_eos=False) for s, _ in train]
  train_tgt = [tok.encode(t) for _, t in train]
  t0 = time.time()
  datastore, retriever = SuffixIndex(train_tgt), Retriever(train_src)
  print(f'indexed {len(train):,} training pairs in {time.time() - t0:.0f} s', flush=True)

  def drafter(index_of, min_n: int):
    def draft(source):
      index = index_of(source)

      def propose(prefix):
        seq = [0, 0, *prefix]
        for _ in range(gamma):
          nxt = index.next(seq[2:], min_n) if index else None
          seq.append(tri(seq[-2], seq[-1]) if nxt is None else nxt)
        return seq[-gamma:]

      return propose

    return draft

  def retrieved(k):
    return lambda src: SuffixIndex([train_tgt[i] for i in retriever(src, k)] + [src + [1]])

  drafters = {
    'trigram': drafter(lambda src: None, 1),
    'datastore (suffix >= 2)': drafter(lambda src: datastore, 2),
    'retrieval 8 (suffix >= 2)': drafter(retrieved(8), 2),
    'retrieval 8 (suffix >= 3)': drafter(retrieved(8), 3),
    'retrieval 32 (suffix >= 3)': drafter(retrieved(32), 3),
    'source copy (suffix >= 2)': drafter(lambda src: SuffixIndex([src + [1]]), 2),
  }
  splits = {'test': [s for s, _ in pair.test_pairs()[: _NUM.value]]}
  if _VALID.value:
    splits['valid'] = [s for s, _ in pairs.load_pairs(_VALID.value)[: min(_NUM.value, 256)]]
  for split, texts in splits.items():
    t0 = time.time()
    outputs = []
    for i in range(0, len(texts), 32):
      ids, mask = tok.encode_batch(texts[i : i + 32], 64, truncate=True)
      out = decode.generate(
        pair.target,
        ids,
        mask,
        sampling=SamplingConfig(temperature=0.0),
        max_new_tokens=64,
        rng=jax.random.key(0),
      )
      outputs += [list(r[:n]) for r, n in zip(np.asarray(out.tokens), np.asarray(out.lengths))]
    print(f'{split}: {len(texts)} greedy outputs in {time.time() - t0:.0f} s; gamma {gamma}')
    sources = [tok.encode(s, add_eos=False) for s in texts]
    for name, draft in drafters.items():
      e = tokens_per_call(draft, sources, outputs, gamma)
      print(f'  {name:28s} tokens/call {e:.3f}  alpha {equivalent_alpha(e, gamma):.3f}', flush=True)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
