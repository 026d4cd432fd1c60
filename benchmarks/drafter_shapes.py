r"""Drafter shapes by the cost model: in-loop c and pass cost, and the speedup they allow.

  python -m benchmarks.drafter_shapes                  # shipped target + two 50M shapes
  python -m benchmarks.drafter_shapes --gamma=4 --alphas=0.4,0.6

For each target (the shipped 13.5M `pretrained/ende` target, a 52M t5_1_1-small-shaped T5 and
the 48M shape of `train_target.py:grown`, both with random weights: costs do not depend on them)
and each candidate drafter (the shipped trigram; decoders over the target's encoder of width 128 /
256 and depth 1 / 2, random weights), measures inside a jitted loop the target step, the
(gamma+1)-position pass and the drafter step (`timing.step_costs`), and prints
`analysis.walltime_improvement_measured` at each alpha of --alphas: the speedup a drafter of that
shape would give if distillation reaches that alpha.
Alpha itself needs a trained drafter (scripts/distill.py); this picks which shape to train.

Past runs: docs/performance.md, "Measurements moved from docstrings" (`drafter_shapes`).
"""

import jax
from absl import app, flags, logging

import benchmarks
from specdec_jax import analysis, pretrained
from specdec_jax.measure import timing
from specdec_jax.models import t5

_GAMMA = flags.DEFINE_integer('gamma', 3, 'Drafted tokens per iteration.')
_ALPHAS = flags.DEFINE_list('alphas', ['0.35', '0.45', '0.55', '0.65'], 'Acceptance rates.')
_SOURCE_LENGTH = flags.DEFINE_integer('source_length', 32, 'Source tokens (all real).')


def _random_t5(seed: int, **shape) -> t5.T5Model:
  config = t5.T5Config(vocab_size=8000, feed_forward='gated-gelu', **shape)
  return t5.T5Model(config=config, params=t5.init_params(jax.random.key(seed), config))


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
  pair = pretrained.load('ende')
  targets = {
    'shipped 13.5M': pair.target,
    't5_1_1-small 52M': _random_t5(
      0,
      d_model=512,
      d_kv=64,
      num_heads=6,
      d_ff=1024,
      num_encoder_layers=8,
      num_decoder_layers=8,
      tie_word_embeddings=False,
    ),
    # experiments/configs/train_target.py:grown, the shipped target grown (models/t5_growth).
    'grown 48M': _random_t5(
      0,
      d_model=512,
      d_kv=64,
      num_heads=8,
      d_ff=1024,
      num_encoder_layers=4,
      num_decoder_layers=8,
      tie_word_embeddings=False,
    ),
  }
  alphas = [float(a) for a in _ALPHAS.value]
  gamma = _GAMMA.value
  print(f'gamma {gamma}; predicted speedup at alpha {", ".join(map(str, alphas))}')
  for target_name, target in targets.items():
    drafters = {'trigram (shipped)': pair.drafters['trigram']}
    for width, depth in [(128, 1), (128, 2), (256, 1), (256, 2)]:
      drafters[f'decoder d{width} x{depth}'] = _random_t5(
        1,
        d_model=width,
        d_kv=32,
        num_heads=width // 32,
        d_ff=4 * width,
        num_encoder_layers=0,
        num_decoder_layers=depth,
        encoder_dim=target.config.d_model,
      )
    for name, drafter in drafters.items():
      costs = timing.step_costs(
        target,
        drafter,
        batch_size=1,
        source_length=_SOURCE_LENGTH.value,
        gamma=gamma,
        cache_len=72,
      )
      predicted = [
        float(
          analysis.walltime_improvement_measured(
            a, gamma, costs['c'], costs['pass_cost'], costs['c_fixed']
          )
        )
        for a in alphas
      ]
      print(
        f'{target_name:18s} {name:18s} target step {costs["target_step"] * 1e3:6.2f} ms, '
        f'drafter step {costs["drafter_step"] * 1e3:5.2f} ms, c {costs["c"]:.3f} + '
        f'{costs["c_fixed"]:.3f} fixed, pass {costs["pass_cost"]:.2f} steps | '
        + '  '.join(f'{p:.2f}x' for p in predicted),
        flush=True,
      )


if __name__ == '__main__':
  app.run(main)
