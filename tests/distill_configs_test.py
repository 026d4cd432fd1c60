"""Tests of experiments/configs/distill_drafter.py: every variant parses and starts from models
this checkout has, and `paper` (T5 11B's one-layer drafter on a v4-32) is consistent with the
target of ende.py:paper and with its mesh."""

import json
import pathlib

import jax
import pytest

from benchmarks import machines
from experiments.configs import distill_drafter, ende
from specdec_jax import sharding
from specdec_jax.models import t5, t5_growth
from specdec_jax.training import distill, distill_loss, trainer

_VARIANTS = (
  'runlocal',
  'independent',
  'grown',
  'deeper',
  'eagle',
  'debsumm48m',
  'block',
  'block_wide',
  'block_wide_longer',
  'block_wide_taps',
  'block_debsumm48m',
  'paper',
)


@pytest.mark.parametrize('variant', _VARIANTS)
def test_every_variant_parses(variant):
  config = distill_drafter.get_config(variant)
  assert config.divergence in distill_loss.DIVERGENCES
  trainer.OptimizerConfig.from_config(config)  # raises on a bad schedule
  if variant == 'block_wide_longer':  # continues a run of this checkout's workdir/
    assert config.init_from.startswith('workdir/') and not config.init_from_target_layers
  elif variant != 'paper':  # its teacher is on gs://; every other variant's is in pretrained/
    for path in (config.teacher, config.init_from, config.tokenizer):
      assert not path or (pathlib.Path(path).exists() and '/pretrained/' in path), (variant, path)


def test_paper_reads_the_target_files_of_ende_paper():
  config, paper = distill_drafter.get_config('paper'), ende.get_config('paper')
  assert (config.teacher, config.tokenizer, config.test_file) == (
    paper.target,
    paper.tokenizer,
    paper.test_file,
  )
  assert config.teacher.startswith('gs://') and 't5_11B' in config.teacher
  staged = pathlib.Path(paper.tokenizer).parent
  assert {pathlib.Path(config.train_file).parent, pathlib.Path(config.valid_file).parent} == {
    staged
  }
  assert (config.max_source_length, config.max_target_length) == (
    paper.max_source_length,
    paper.max_new_tokens,
  )


def test_paper_fits_a_v4_32_mesh():
  config = distill_drafter.get_config('paper')
  data, model = sharding.parse_mesh(config.mesh)
  assert data * model == machines.MACHINES['v4-32'].devices == 16
  for name in ('batch_size', 'generate_batch_size', 'eval_batch_size'):
    assert config[name] % data == 0, (name, config[name], data)
  sharding.check_placement(config.student_sharding)
  assert config.student_sharding == 'replicated' and not config.cache_teacher
  buckets = tuple(config.length_buckets)
  assert buckets == tuple(sorted(buckets))
  assert buckets[-1] >= max(config.max_source_length, config.max_target_length)


def test_paper_student_is_one_layer_at_the_teachers_width_over_its_encoder():
  config = distill_drafter.get_config('paper')
  teacher = t5.T5Model(config=t5.CONFIGS['t5-11b'], params={})
  student = distill.student_config_for(config, teacher)
  assert student.d_model == student.encoder_dim == teacher.config.d_model == 1024
  assert (student.num_encoder_layers, student.num_decoder_layers) == (0, 1)
  assert student.num_heads * student.d_kv == student.d_model
  assert student.vocab_size == teacher.config.vocab_size and student.feature_dim is None


@pytest.mark.parametrize('variant', ['block_wide', 'block_wide_taps'])
def test_block_wide_is_built_from_the_shipped_target(variant):
  # Its student has the ende48m target's shape, the layers it names exist (and those it reads),
  # and what it freezes names params (shapes only: no weights are read).
  config = distill_drafter.get_config(variant)
  target_config = t5.T5Config(
    **json.loads((pathlib.Path(config.teacher) / 'config.json').read_text())
  )
  shapes = jax.eval_shape(lambda key: t5.init_params(key, target_config), jax.random.key(0))
  teacher = t5.T5Model(config=target_config, params=shapes)
  student = distill.student_config_for(config, teacher)
  drafter = t5_growth.drafter_from_target(
    teacher, student, tuple(config.init_from_target_layers), jax.random.key(0)
  )
  frozen = trainer.frozen_mask(drafter.params, tuple(config.frozen))
  assert sum(jax.tree.leaves(frozen)) == 2 and student.block_size == 8
  taps = student.feature_layers or (None,)
  assert student.feature_dim == len(taps) * target_config.d_model
  if student.feature_layers is not None:
    assert teacher.steps.tap_states(student.feature_layers).state_dim == student.feature_dim
