"""scripts/tpu_hour.py: its plan (a costs stage per mesh and compiler setting, then the grown
pair's main job), its table, and `--dry_run` compiling the plan's programs for a v4-8."""

import pytest

from scripts import tpu_hour
from tests import helpers


@pytest.fixture
def parsed():
  """The script's flags parsed from `argv` (reset after)."""

  def parse(*argv):
    tpu_hour.FLAGS.unparse_flags()
    tpu_hour.FLAGS(['tpu_hour', *argv])

  yield parse
  tpu_hour.FLAGS.unparse_flags()


def test_the_plan_times_each_mesh_with_and_without_dot_strength_reduction_then_runs_the_main_job(
  parsed,
):
  parsed()
  stages = tpu_hour.plan()
  assert [s.name for s in stages] == [
    'costs 1x1 as_is',
    'costs 1x1 no_dot_strength_reduction',
    'costs 1x4 as_is',
    'costs 1x4 no_dot_strength_reduction',
    'main',
  ]
  off = stages[1].command()
  assert off.startswith('LIBTPU_INIT_ARGS=--xla_tpu_enable_dot_strength_reduction=false ')
  assert '--stage=costs --meshes=1x1 --pair=ende48m --grow_to=t5_1_1-xxl' in off
  assert 'LIBTPU' not in stages[0].command()
  assert (
    stages[-1]
    .command()
    .endswith(
      '-m experiments.translate --config=experiments/configs/ende.py:xxl --workdir=/tmp/tpu_hour/main'
    )
  )
  parsed('--variants=as_is,fast')
  with pytest.raises(Exception, match="'fast' is not one of"):
    tpu_hour.plan()


def test_the_table_gives_the_formula_at_the_paper_s_alpha_and_the_measured_one(parsed):
  parsed('--gamma=7')
  cost = dict(mesh='1x4', drafter='distilled', target_step=0.02, target_pass=0.025, pass_cost=1.25,
              c=0.0, c_alone=0.01, c_fixed=0.0)  # fmt: skip
  text = tpu_hour.table(
    [dict(cost, libtpu_args=''), dict(cost, libtpu_args='--x', drafter='bigram')],
    {'distilled': 0.5},
  )
  lines = text.splitlines()
  assert len(lines) == 3 and 'no_dot_strength_reduction' in lines[2]
  # (1 - 0.75^8) / (1 - 0.75) / 1.25 = 2.88; at alpha 0.5: 1.594; the bigram has no alpha.
  assert '2.88' in lines[1] and '1.59' in lines[1] and '20.00' in lines[1]
  assert lines[2].rstrip().endswith('-')


@pytest.mark.slow  # 85 s under load
@helpers.needs_libtpu
@helpers.needs_pair('ende')
def test_dry_run_prints_the_plan_and_compiles_it_for_a_v4_8(parsed, capsys):
  """The 13.5M pair grown to t5_1_1-small shapes, on 1x4, as is: the build, `generate` and the
  loop with a T5 and an n-gram drafter, compiled by XLA:TPU (a few CPU-seconds each)."""
  parsed('--dry_run', '--pair=ende', '--grow_to=t5_1_1-small', '--meshes=1x4', '--variants=as_is',
         '--drafters=distilled,bigram', '--max_new_tokens=8', '--source_length=16')  # fmt: skip
  tpu_hour.main(['tpu_hour'])
  out = capsys.readouterr().out
  assert out.count('would run: ') == 2  # the costs stage and the main job
  for name in ('build', 'generate', 'distilled', 'bigram'):
    assert f'compiled for v4-8 1x4 as_is: {name}: arguments' in out, out
  assert out.count('Mcycles an iteration') == 3
