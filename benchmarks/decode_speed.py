r"""Decode speed: what one loop iteration costs, where it goes, and throughput by batch size.

  python -m benchmarks.decode_speed                       # the shipped pair (pretrained/ende)
  python -m benchmarks.decode_speed --random_weights --target=t5_1_1-small --drafter=tiny-v1.0

Everything is measured in one run on real test sources (the shipped test.tsv; random ids with
--random_weights), gamma 4, batch 1 unless stated:
1. Model calls inside a jitted loop (no Python dispatch): the target step, the (gamma+1)-position
   target pass and its cost in steps, the drafter step and c.
2. Per iteration, for each batch in --breakdown_batches and temperature: wall time of `generate`
   and `speculative_generate` (bigram and T5 drafters), the goals' ratios, and the share of an
   iteration spent in each component, from XLA:CPU's per-op trace (`specdec_jax.measure.profiling`):
   drafter model, target model, sampling (probability transforms and draws), verification,
   emit/rewind/stats, and the loop itself (time in no op). At temperature 0 the general path on
   the same one-hot vectors (top_k=1 at temperature 1: what the loops ran before the greedy fast
   path, plus the top-k and the draws) is measured too.
3. Tokens/s at each of --batches for autoregressive, token and block verification.

Goals (issue 8): a bigram-drafted iteration <= 1.15x the bare (gamma+1)-position pass; `generate`
<= 1.15x the bare step per token; batch-8 autoregressive throughput >= 4x batch 1.

Past runs: docs/performance.md, "The loop against its model calls".
"""

from specdec_jax.measure import profiling

profiling.enable_tracing()  # before JAX starts: per-op trace events for the breakdown

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from benchmarks import synthetic
from experiments.configs import train_drafter, train_target
from specdec_jax import decode, drafters
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing, translation
from specdec_jax.models import t5

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'ende', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_RANDOM = flags.DEFINE_bool(
  'random_weights',
  False,
  'Random-weight models of --target/--drafter '
  'shapes instead of the shipped pair (random ids as sources).',
  flag_values=FLAGS,
)
_TARGET = flags.DEFINE_string(
  'target', 'ende-target', 'Random target: a t5.CONFIGS key or ende-*.', flag_values=FLAGS
)
_DRAFTER = flags.DEFINE_string(
  'drafter', 'ende-drafter', 'Random drafter (same vocabulary).', flag_values=FLAGS
)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'float32', ['float32', 'bfloat16'], "Random models' dtype.", flag_values=FLAGS
)
_BATCHES = flags.DEFINE_list(
  'batches', ['1', '8', '32'], 'Batch sizes for tokens/s.', flag_values=FLAGS
)
_BREAKDOWN = flags.DEFINE_list(
  'breakdown_batches', ['1', '8'], 'Batch sizes for the breakdown.', flag_values=FLAGS
)
_TEMPS = flags.DEFINE_list('temperatures', ['0', '1'], 'Temperatures.', flag_values=FLAGS)
_GAMMA = flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Most tokens per row.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 64, 'Padded source length.', flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (median).', flag_values=FLAGS)
_ROWS = flags.DEFINE_integer(
  'rows', 16, 'Test sources decoded per measurement, in batches.', flag_values=FLAGS
)

# The shapes we train for EN->DE, with an 8k vocabulary: their training configs' models.
_TRAINED = {'ende-target': train_target, 'ende-drafter': train_drafter}


def _random_model(name: str, seed: int) -> t5.T5Model:
  """--target / --drafter: a `t5.CONFIGS` name or ende-target / ende-drafter, with random
  weights (`synthetic.model`) in --dtype."""
  if name in _TRAINED:
    config = t5.T5Config(**_TRAINED[name].get_config().model.to_dict())
  else:
    config = synthetic.shape(name)
  return synthetic.model(config, dtype=_DTYPE.value, weights='random', seed=seed)


def _models_and_sources(max_rows: int):
  """(target, {drafter name: drafter}, source ids int32[max_rows, S], mask)."""
  s = _SOURCE_LENGTH.value
  if _RANDOM.value:
    target, drafter = _random_model(_TARGET.value, 0), _random_model(_DRAFTER.value, 1)
    ids = np.random.default_rng(0).integers(2, 1000, (max_rows, s))
    bigram = drafters.NGramDrafter.fit(
      [ids[:, :8].reshape(-1)], vocab_size=target.config.vocab_size
    )
    return (
      target,
      {'bigram': bigram, 't5': drafter},
      jnp.asarray(ids, jnp.int32),
      jnp.ones_like(jnp.asarray(ids, jnp.int32)),
    )
  pair = benchmarks.load_pair(_DIR.value)
  target, tokenizer = pair.target, pair.tokenizer
  # The T5 drafter measured is the pair's recommended one (the small independent T5 if the
  # bigram is recommended).
  t5_name = pair.recommended if pair.recommended != 'bigram' else 'small-t5'
  found = {'bigram': pair.drafters['bigram'], 't5': pair.drafters[t5_name]}
  sources = [src for src, _ in pair.test_pairs()]
  sources = (sources * (max_rows // len(sources) + 1))[:max_rows]
  # Batches of similar lengths, as a server buckets requests: a batch runs until its longest row
  # is done, and ragged rows would measure the batch's padding rather than the loop.
  sources.sort(key=lambda text: len(tokenizer.encode(text)))
  ids, mask = tokenizer.encode_batch(sources, s, truncate=True)
  return target, found, jnp.asarray(ids), jnp.asarray(mask)


def _calls(
  target,
  drafter,
  ids,
  mask,
  batch,
  temperature,
  *,
  gamma,
  verifier='token',
  fast=True,
  max_new_tokens=None,
):
  """(jitted loop, [(args, kwargs)] over the batches of ids) of generate (drafter None) or
  speculative_generate; the loops themselves, so the general path can be run at temperature 0."""
  sampling = sampling_lib.SamplingConfig(temperature=temperature)
  if not fast:  # temperature 0's tokens by the general path: one-hot probability vectors
    sampling = sampling_lib.SamplingConfig(temperature=1.0, top_k=1)
  spec = decode.LoopSpec(
    sampling=sampling,
    max_new_tokens=max_new_tokens or _MAX_NEW.value,
    gamma=0 if drafter is None else gamma,
    verifier=verifier,  # at temperature 0 (fast path) 'token' and 'block' are one program
  )
  kw = dict(spec=spec)
  calls = []
  for i in range(0, ids.shape[0], batch):
    rng = jax.random.key(i)
    if drafter is None:
      args = (target.steps, target.params, ids[i : i + batch], mask[i : i + batch], rng)
    else:
      args = (
        target.steps,
        target.params,
        drafter.steps,
        drafter.params,
        ids[i : i + batch],
        mask[i : i + batch],
        rng,
      )
    calls.append((args, kw))
  return (decode.autoregressive_loop if drafter is None else decode.speculative_loop), calls


def _timed(jitted, calls):
  """Median seconds of one pass over `calls`."""
  return timing.time_call(lambda: [jitted(*a, **k).tokens for a, k in calls], _REPEATS.value)[1]


@dataclasses.dataclass
class Measured:
  seconds: float  # one pass over the calls
  iteration: float  # seconds per loop iteration, the per-call fixed cost taken out
  iterations: int
  tokens: int
  stats: decode.DecodeStats  # pooled


def _measure(target, drafter, ids, mask, batch, temperature, **kw) -> tuple[Measured, object]:
  """Times a pass over the batches, and a pass with max_new_tokens=1 (one iteration per call:
  encoding, cache setup, dispatch and one iteration), whose difference is what the iterations
  cost; returns it with the profile breakdown of the pass."""
  jitted, calls = _calls(target, drafter, ids, mask, batch, temperature, **kw)
  outs = [jitted(*a, **k) for a, k in calls]
  seconds = _timed(jitted, calls)
  one = _timed(*_calls(target, drafter, ids, mask, batch, temperature, max_new_tokens=1, **kw))
  iterations = sum(int(o.stats.target_calls.max()) for o in outs)
  stats = jax.tree.map(lambda *x: jnp.concatenate(x), *[o.stats for o in outs]).summed()
  # The line through (the calls at one iteration each, `one`) and (the whole pass, `seconds`).
  _, per_iteration = translation.loop_costs([one, seconds], [len(calls), iterations])
  m = Measured(
    seconds,
    per_iteration,
    iterations,
    sum(int(o.lengths.sum()) for o in outs),
    stats,
  )
  return m, profiling.breakdown(jitted, calls)


def _shares(b: profiling.Breakdown) -> str:
  return ' '.join(f'{k} {100 * v:4.1f}%' for k, v in b.shares(exclude=('encode',)).items())


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  gamma = _GAMMA.value
  batches = sorted({int(b) for b in _BATCHES.value + _BREAKDOWN.value})
  rows = max(batches + [_ROWS.value])
  target, found, all_ids, all_mask = _models_and_sources(rows)
  count = lambda m: t5.param_count(m.params)
  print(
    f'device: {jax.devices()[0].device_kind}, {jax.device_count()} device(s); target '
    f'{count(target) / 1e6:.2f}M params, T5 drafter {count(found["t5"]) / 1e6:.2f}M; '
    f'gamma {gamma}, source length {_SOURCE_LENGTH.value}, up to {_MAX_NEW.value} new tokens; '
    f'median of {_REPEATS.value}'
  )

  for batch in map(int, _BREAKDOWN.value):
    n = max(batch, _ROWS.value // batch * batch)
    ids, mask = all_ids[:n], all_mask[:n]
    kw = dict(
      batch_size=batch,
      source_length=_SOURCE_LENGTH.value,
      cache_len=decode.buffer_length(_MAX_NEW.value, gamma),
    )
    step = timing.step_seconds(target, **kw)
    pass_ = timing.step_seconds(target, num_tokens=gamma + 1, **kw)
    d_step = timing.step_seconds(found['t5'], target=target, **kw)
    print(
      f'\n== batch {batch}: in-loop target step {step * 1e3:.3f} ms, {gamma + 1}-position '
      f'pass {pass_ * 1e3:.3f} ms = {pass_ / step:.2f} steps; T5 drafter step '
      f'{d_step * 1e3:.3f} ms, c = {d_step / step:.3f}'
    )
    for temperature in map(float, _TEMPS.value):
      for fast in [True, False] if temperature == 0 else [True]:
        label = '' if temperature else (' [fast path]' if fast else ' [general path: top_k=1]')
        print(f'-- temperature {temperature:g}{label}')
        m, b = _measure(target, None, ids, mask, batch, temperature, gamma=gamma, fast=fast)
        print(
          f'   autoregressive: {m.iteration * 1e3:.3f} ms/iteration = '
          f'{m.iteration / step:.2f}x the bare step | {_shares(b)}'
        )
        for name, drafter in found.items():
          m, b = _measure(target, drafter, ids, mask, batch, temperature, gamma=gamma, fast=fast)
          bare, what = (
            (pass_, 'pass')
            if name != 't5'
            else (pass_ + gamma * d_step, 'pass + gamma drafter steps')
          )
          print(
            f'   {name:6s} token: {m.iteration * 1e3:.3f} ms/iteration = '
            f'{m.iteration / bare:.2f}x the bare {what}; alpha {float(m.stats.alpha):.2f} '
            f'| {_shares(b)}'
          )

  print('\n== tokens/s (temperature 0, T5 drafter, gamma %d)' % gamma)
  ar_tps = {}
  for batch in map(int, _BATCHES.value):
    n = max(batch, _ROWS.value // batch * batch)
    ids, mask = all_ids[:n], all_mask[:n]
    line = []
    for method in ('autoregressive', 'token', 'block'):
      drafter = None if method == 'autoregressive' else found['t5']
      jitted, calls = _calls(
        target,
        drafter,
        ids,
        mask,
        batch,
        0.0,
        gamma=gamma,
        verifier='token' if drafter is None else method,
      )
      outs = [jitted(*a, **k) for a, k in calls]
      sec, tokens = _timed(jitted, calls), sum(int(o.lengths.sum()) for o in outs)
      line.append(f'{method} {tokens / sec:8.1f}')
      if method == 'autoregressive':
        ar_tps[batch] = tokens / sec
    print(f'   batch {batch:3d}: ' + '   '.join(line))
  if 1 in ar_tps and 8 in ar_tps:
    print(f'   autoregressive throughput, batch 8 / batch 1: {ar_tps[8] / ar_tps[1]:.2f}x')


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
