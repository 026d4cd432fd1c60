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

Past runs: docs/performance.md, "Drafter shapes".
"""

from absl import flags

import benchmarks
from benchmarks import synthetic
from experiments.configs import train_target
from specdec_jax import analysis
from specdec_jax.measure import timing
from specdec_jax.models import t5

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Drafted tokens per iteration.', flag_values=FLAGS)
_ALPHAS = flags.DEFINE_list(
  'alphas', ['0.35', '0.45', '0.55', '0.65'], 'Acceptance rates.', flag_values=FLAGS
)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 32, 'Source tokens (all real).', flag_values=FLAGS
)


def _random_t5(seed: int, config: t5.T5Config) -> t5.T5Model:
  return synthetic.model(config, dtype='float32', weights='random', seed=seed)


def _target_shape(variant: str) -> t5.T5Config:
  """The target of `experiments/configs/train_target.py:variant`, its shape alone."""
  return t5.T5Config(**train_target.get_config(variant).model.to_dict())


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  benchmarks.quiet_checkpoint_logs()  # orbax logs every file it reads at INFO
  pair = benchmarks.load_pair('ende')
  targets = {
    'shipped 13.5M': pair.target,
    't5_1_1-small 52M': _random_t5(0, _target_shape('t5_1_1_small')),
    # experiments/configs/train_target.py:grown, the shipped target grown (models/t5_growth).
    'grown 48M': _random_t5(0, _target_shape('grown')),
  }
  alphas = [float(a) for a in _ALPHAS.value]
  gamma = _GAMMA.value
  print(f'gamma {gamma}; predicted speedup at alpha {", ".join(map(str, alphas))}')
  for target_name, target in targets.items():
    drafters = {'trigram (shipped)': pair.drafters['trigram']}
    for width, depth in [(128, 1), (128, 2), (256, 1), (256, 2)]:
      drafters[f'decoder d{width} x{depth}'] = _random_t5(
        1,
        t5.T5Config(
          vocab_size=8000,
          feed_forward='gated-gelu',
          d_model=width,
          d_kv=32,
          num_heads=width // 32,
          d_ff=4 * width,
          num_encoder_layers=0,
          num_decoder_layers=depth,
          encoder_dim=target.config.d_model,
        ),
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
  benchmarks.run(main, FLAGS)
