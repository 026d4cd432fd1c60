r"""Source-lookup drafting in the loop, beside the distilled drafter and the block drafter's tree:
tokens per target call and speed against autoregressive decoding, measured in one run.

  python -m benchmarks.lookup_loop --pretrained=ende48m
  python -m benchmarks.lookup_loop --pretrained=debsumm48m --source_length=256 --temperatures=0

Batch 1, each test sentence decoded by every method in turn, `--rounds` timed rounds after one
that compiles and counts. Rows: the distilled drafter's chain, the block drafter's best-first tree
(`--tree_nodes`), the source lookup's chain and its tree of `--branches` matches, and the hybrid
tree (the block drafter's best-first tree and the lookup branches under one root). At T = 0 every
row's tokens are the autoregressive ones (checked, printed).
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from specdec_jax import decode, draft_lookup
from specdec_jax.measure import timing
from specdec_jax.sampling import SamplingConfig

FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string('pretrained', 'ende48m', 'A shipped pair.', flag_values=FLAGS)
_SENTENCES = flags.DEFINE_integer('sentences', 40, 'Test sentences.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer('source_length', 64, 'Padded source.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Most tokens a row.', flag_values=FLAGS)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft depth.', flag_values=FLAGS)
_TREE_NODES = flags.DEFINE_integer('tree_nodes', 9, 'Best-first tree nodes.', flag_values=FLAGS)
_BRANCHES = flags.DEFINE_integer('branches', 2, 'Lookup branches (trees).', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 1, 'Timed rounds.', flag_values=FLAGS)
_TEMPERATURES = flags.DEFINE_list('temperatures', ['0', '1'], 'Temperatures.', flag_values=FLAGS)


def methods(pair, gamma: int, tree_nodes: int, branches: int) -> dict:
  """name -> (drafter or None, speculative_generate's keywords)."""
  lookup = draft_lookup.source_lookup(pair.target)
  block = pair.drafters['block']
  rows = {
    'autoregressive': (None, {}),
    'distilled': (pair.drafters['distilled'], dict(gamma=gamma)),
    'block tree': (block, dict(gamma=gamma, tree=decode.TreeSpec(tree_nodes))),
    'lookup': (lookup, dict(gamma=gamma)),
    'lookup tree': (
      lookup,
      dict(gamma=gamma, tree=decode.TreeSpec(1 + branches * gamma, 'lookup', branches=branches)),
    ),
    'hybrid tree': (
      block,
      dict(
        gamma=gamma,
        tree=decode.TreeSpec(tree_nodes + branches * gamma, 'hybrid', branches=branches),
      ),
    ),
  }
  return rows


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  pair = benchmarks.load_pair(_DIR.value)
  sources = [s for s, _ in pair.test_pairs()[: _SENTENCES.value]]
  encode = lambda s: pair.tokenizer.encode_batch([s], _SOURCE_LENGTH.value, truncate=True)
  batches = [tuple(map(jnp.asarray, encode(s))) for s in sources]  # on device before the clock
  rows = methods(pair, _GAMMA.value, _TREE_NODES.value, _BRANCHES.value)
  for temperature in map(float, _TEMPERATURES.value):
    sampling = SamplingConfig(temperature=temperature)

    def run(name, ids, mask, seed):
      drafter, kw = rows[name]
      common = dict(sampling=sampling, max_new_tokens=_MAX_NEW.value, rng=seed)
      if drafter is None:
        return decode.generate(pair.target, ids, mask, **common)
      return decode.speculative_generate(pair.target, drafter, ids, mask, **common, **kw)

    keys = [jax.random.key(i) for i in range(len(batches))]
    calls, emitted, tokens = {}, {}, {}
    for name in rows:  # compile, count
      outs = [run(name, *b, k) for b, k in zip(batches, keys)]
      calls[name] = sum(int(o.stats.target_calls.sum()) for o in outs)
      emitted[name] = sum(int(o.lengths.sum()) for o in outs)
      tokens[name] = [np.asarray(o.tokens) for o in outs]
    seconds = dict.fromkeys(rows, 0.0)
    for _ in range(_ROUNDS.value):
      for b, k in zip(batches, keys):
        for name in rows:
          seconds[name] += timing.timed(lambda: run(name, *b, k).tokens, name)[1]
    print(
      f'{_DIR.value}, T={temperature:g}: {len(sources)} test sentences, batch 1, gamma '
      f'{_GAMMA.value}, best-first tree {_TREE_NODES.value} nodes, {_BRANCHES.value} lookup '
      f'branches, {_ROUNDS.value} timed round(s) in turn'
    )
    print(f'{"method":16s} {"tokens/call":>11s} {"speed":>7s} {"same tokens as AR":>18s}')
    for name in rows:
      same = all(np.array_equal(a, b) for a, b in zip(tokens[name], tokens['autoregressive']))
      speed = seconds['autoregressive'] / seconds[name] if seconds[name] else float('nan')
      print(
        f'{name:16s} {emitted[name] / calls[name]:11.3f} {speed:6.2f}x '
        f'{str(same) if temperature == 0 else "-":>18s}'
      )


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
