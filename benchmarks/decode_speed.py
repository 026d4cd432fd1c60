r"""Decode speed of random-weight T5 pairs: autoregressive vs speculative, measured in one run.

  python -m benchmarks.decode_speed                      # ~13M target / ~0.7M drafter (ours)
  python -m benchmarks.decode_speed --target=t5_1_1-small --drafter=tiny-v1.0 --batches=1,8

Prints, for each batch size: autoregressive and speculative tokens/s (token and block
verification), the share of an iteration spent in verification, the cost of the gamma+1-position
target pass relative to a 1-position step, and compile times. Decoding is greedy (temperature 0),
so both loops emit the same tokens; tokens/s counts the tokens emitted (random weights may stop
a row early at EOS).
Goals: verification <= 3% of an iteration; batch-8 throughput >= 5x batch-1.
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specdec_jax import decode, sampling as sampling_lib, verify
from specdec_jax.models import t5

_TARGET = flags.DEFINE_string('target', 'ende-target', 'Target size: a t5.CONFIGS key or ende-*.')
_DRAFTER = flags.DEFINE_string('drafter', 'ende-drafter', 'Drafter size (same vocabulary).')
_BATCHES = flags.DEFINE_list('batches', ['1', '8', '32'], 'Batch sizes.')
_GAMMA = flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration.')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 32, 'Tokens decoded per row.')
_SOURCE_LEN = flags.DEFINE_integer('source_len', 24, 'Source length.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (the median is reported).')

# The shapes we train for EN->DE (experiments/configs/train_*.py), with an 8k vocabulary.
SIZES = {
  'ende-target': dataclasses.replace(t5.CONFIGS['t5_1_1-small'], vocab_size=8000, d_model=256,
                                     d_ff=1024, num_heads=4, num_encoder_layers=4,
                                     num_decoder_layers=4),
  'ende-drafter': dataclasses.replace(t5.CONFIGS['t5-small'], vocab_size=8000, d_model=64,
                                      d_kv=16, d_ff=256, num_heads=4, num_encoder_layers=2,
                                      num_decoder_layers=1),
}


def _model(name: str, seed: int) -> t5.T5Model:
  config = SIZES[name] if name in SIZES else t5.CONFIGS[name]
  return t5.T5Model(config=config, params=t5.init_params(jax.random.key(seed), config))


def _num_params(model) -> int:
  return sum(x.size for x in jax.tree.leaves(model.params))


def _timed(fn, repeats):
  """(first-call seconds, median seconds of `repeats` further calls)."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, float(np.median(times))


def _step_cost(model, batch, gamma, repeats):
  """Seconds of one decode call with T = 1 and with T = gamma + 1, from a 16-token cache."""
  cfg = model.config
  ids = jnp.ones((batch, _SOURCE_LEN.value), jnp.int32)
  enc = t5.encode(model.params, ids, jnp.ones_like(ids), config=cfg)
  cache = t5.init_cache(model.params, enc, jnp.ones_like(ids), config=cfg, max_decode_len=64)
  cache = cache.replace(end_index=jnp.full((batch,), 16, jnp.int32))
  step = jax.jit(functools.partial(t5.decode, config=cfg))
  costs = []
  for t in (1, gamma + 1):
    tokens = jnp.ones((batch, t), jnp.int32)
    costs.append(_timed(lambda: step(model.params, tokens, cache)[0], repeats)[1])
  return costs


def _verify_cost(batch, gamma, vocab, repeats):
  rng = jax.random.key(0)
  q = jax.nn.softmax(jax.random.normal(rng, (batch, gamma, vocab)), -1)
  p = jax.nn.softmax(jax.random.normal(jax.random.key(1), (batch, gamma + 1, vocab)), -1)
  drafts = jax.random.randint(rng, (batch, gamma), 0, vocab)
  return {name: _timed(lambda fn=fn: fn(rng, drafts, q, p), repeats)[1]
          for name, fn in verify.VERIFIERS.items()}


def main(argv):
  del argv
  target, drafter = _model(_TARGET.value, 0), _model(_DRAFTER.value, 1)
  gamma, max_new, repeats = _GAMMA.value, _MAX_NEW.value, _REPEATS.value
  greedy = sampling_lib.SamplingConfig(temperature=0.0)
  print(f'device: {jax.devices()[0].device_kind}; target {_TARGET.value} '
        f'({_num_params(target) / 1e6:.2f}M params), drafter {_DRAFTER.value} '
        f'({_num_params(drafter) / 1e6:.2f}M), gamma={gamma}, {max_new} new tokens/row, '
        f'temperature 0, median of {repeats}')
  ar_tps = {}
  for batch in map(int, _BATCHES.value):
    ids = jnp.asarray(np.random.default_rng(batch).integers(2, 1000, (batch, _SOURCE_LEN.value)),
                      jnp.int32)
    mask = jnp.ones_like(ids)
    kw = dict(sampling=greedy, max_new_tokens=max_new, rng=jax.random.key(0))
    compile_ar, ar = _timed(lambda: decode.generate(target, ids, mask, **kw).tokens, repeats)
    emitted = int(decode.generate(target, ids, mask, **kw).lengths.sum())
    ar_tps[batch] = emitted / ar
    t1, tg = _step_cost(target, batch, gamma, repeats)
    d1, _ = _step_cost(drafter, batch, gamma, repeats)
    verify_s = _verify_cost(batch, gamma, target.config.vocab_size, repeats)
    print(f'\nbatch {batch}: autoregressive {ar_tps[batch]:8.1f} tok/s '
          f'(compile {compile_ar - ar:.1f}s); target step {t1 * 1e3:.2f} ms, '
          f'{gamma + 1}-position pass {tg * 1e3:.2f} ms = {tg / t1:.2f}x a step; '
          f'c = drafter/target step = {d1 / t1:.3f}')
    for verifier in verify.VERIFIERS:
      run = lambda v=verifier: decode.speculative_generate(target, drafter, ids, mask,
                                                           gamma=gamma, verifier=v, **kw)
      compile_s, spec = _timed(lambda: run().tokens, repeats)
      out = run()
      iterations = int(out.stats.target_calls.max())
      share = verify_s[verifier] / (spec / iterations)
      print(f'  {verifier:5s}: speculative {int(out.lengths.sum()) / spec:8.1f} tok/s = '
            f'{ar / spec:.2f}x autoregressive; {iterations} iterations, '
            f'block efficiency {float(out.stats.block_efficiency.mean()):.2f}, '
            f'alpha {float(out.stats.alpha.mean()):.3f}; verification '
            f'{100 * share:.2f}% of an iteration; compile {compile_s - spec:.1f}s')
  if 1 in ar_tps and 8 in ar_tps:
    print(f'\nautoregressive throughput, batch 8 / batch 1: {ar_tps[8] / ar_tps[1]:.2f}x')


if __name__ == '__main__':
  app.run(main)
