r"""Time of one distillation step with the target run live vs from its cached states.

  python -m benchmarks.distill_step                      # shipped 13.5M target, d128x1 student
  python -m benchmarks.distill_step --target_shape=t5_1_1_small   # a 52M random target

Prints, per setting, the median step time of each mode over --steps steps (after a compiled
warm-up; modes interleaved step by step) and their ratio. Batch: --batch_size pairs of
--length source and target tokens. `distill_data.TeacherStates` is what the cached mode reads.
"""

import tempfile

import jax
import numpy as np
from absl import flags

import benchmarks
from benchmarks import synthetic
from experiments.configs import distill_drafter, train_target
from specdec_jax import pretrained
from specdec_jax.data import batching
from specdec_jax.measure import timing
from specdec_jax.models import t5
from specdec_jax.training import distill_data, distill_loss, trainer

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_SHAPE = flags.DEFINE_enum(
  'target_shape', 'shipped', ['shipped', 't5_1_1_small'], 'Target.', flag_values=FLAGS
)
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per mode.', flag_values=FLAGS)
_BATCH = flags.DEFINE_integer('batch_size', 64, 'Pairs per step.', flag_values=FLAGS)
_LENGTH = flags.DEFINE_integer(
  'length', 24, 'Source and target tokens per pair.', flag_values=FLAGS
)


def main(argv):
  del argv
  if _SHAPE.value == 'shipped':
    teacher = pretrained.load('ende').target
  else:
    config = t5.T5Config(**train_target.get_config('t5_1_1_small').model.to_dict())
    teacher = synthetic.model(config, dtype='float32', weights='random')
  student = distill_drafter.get_config().student.to_dict()
  student_config = t5.T5Config(
    **dict(student, vocab_size=teacher.config.vocab_size, encoder_dim=teacher.config.d_model)
  )
  n, length = _BATCH.value, _LENGTH.value
  rng = np.random.default_rng(0)
  data = batching.EncodedPairs(
    rng.integers(2, teacher.config.vocab_size, (n, length)),
    rng.integers(2, teacher.config.vocab_size, (n, length)),
    np.full(n, length),
    np.full(n, length),
  )
  index = np.arange(n)
  live = batching.batch_arrays(data, index, length, length)
  with tempfile.TemporaryDirectory() as shards:
    cache = distill_data.TeacherStates.compute(
      teacher, data, with_encoder=True, batch_size=n, buckets=[length], shard_dir=shards,
      progress=False,
    )  # fmt: skip
  cached = dict(live, **cache.fields(index, length, length))
  optimizer = trainer.OptimizerConfig()
  state = trainer.init_state(jax.random.key(0), student_config, optimizer)
  kw = dict(student_config=student_config, optimizer_config=optimizer, divergence='fkl')
  times = {'live': [], 'cached': []}
  # Untimed: the first step compiles, and so does the second, on the state a step returns.
  for batch in (live, cached, live, cached):
    state, _ = jax.block_until_ready(distill_loss.jit_distill_step(state, batch, teacher, **kw))
  for _ in range(_STEPS.value):
    for mode, batch in (('live', live), ('cached', cached)):
      step = lambda batch=batch: distill_loss.jit_distill_step(state, batch, teacher, **kw)
      (state, _), seconds = timing.timed(step, f'a {mode} distillation step')
      times[mode].append(seconds)
  live_s, cached_s = (float(np.median(times[m])) for m in ('live', 'cached'))
  params = t5.param_count(teacher.params) / 1e6
  print(
    f'target {_SHAPE.value} ({params:.1f}M params), batch {n} x {length} tokens: '
    f'live {live_s * 1e3:.0f} ms, cached {cached_s * 1e3:.0f} ms per step '
    f'({live_s / cached_s:.1f}x)'
  )


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
