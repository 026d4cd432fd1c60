"""Two processes x 4 CPU devices on one machine, as hosts of a TPU slice are.

Each process calls `sharding.maybe_initialize_distributed('localhost:PORT', 2, id)` (gloo
collectives between the processes), builds a global (data=2, model=4) mesh over all 8 devices,
and runs the main job (`experiments.translate.run`) on a tiny pair, a global batch of 4 split over
'data'; the job calls `generate` and `speculative_generate` at temperatures 0 and 1, with block
verification by default (4 programs a process) and with both verifiers and the timed costs under
`pytest -m slow` (5).
A third process runs the same on one device. The tokens, lengths and accepted counts of every
call, and every written row's deterministic columns, must be equal; only process 0 writes files.
"""

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers

_REPO = pathlib.Path(__file__).resolve().parents[1]
_PAIR = _REPO / 'pretrained' / 'ende'

# Run as `python script.py PROCESS_ID PORT OUT_DIR PAIR_DIR COSTS VERIFIERS` by
# `helpers.run_as_two_hosts_and_one` (PROCESS_ID -1: one process, one device; COSTS 'fake': the
# main job's in-loop cost measurement, dozens of timed loops whose values the comparison ignores,
# is replaced by fixed numbers; VERIFIERS: the config's). The
# last line printed is DONE; process 0 writes OUT_DIR/decode.json and the main job's files under
# OUT_DIR/job_0.
_SCRIPT = r"""
import json, sys
pid, port, out, pair_dir, costs, verifiers = int(sys.argv[1]), *sys.argv[2:7]
from specdec_jax import sharding
if pid >= 0:
  assert sharding.maybe_initialize_distributed(f'localhost:{port}', 2, pid)
import jax
from specdec_jax import decode
from experiments import translate
from experiments.configs import ende
if costs == 'fake':
  from specdec_jax.measure import timing
  timing.step_costs = lambda *a, **k: dict(c=0.1, c_fixed=0.05, c_alone=0.1, pass_cost=1.5)

multi = pid >= 0
assert jax.process_count() == (2 if multi else 1) and jax.device_count() == (8 if multi else 1)
mesh = sharding.make_mesh(2, 4) if multi else None
if multi:  # the batch helper: each process makes only its own two rows
  assert sharding.local_rows(4, mesh) == range(2 * pid, 2 * pid + 2)

# Every generate / speculative_generate call of the main job (warm-ups, paired baselines, each
# method at each temperature), read on every process.
calls = []
def record(fn, name):
  def wrapped(*args, **kw):
    out = fn(*args, **kw)
    if multi:
      assert not args[-1].is_fully_addressable  # the mask: a global batch over both processes
    host = decode.to_host(out)
    calls.append(dict(name=name, verifier=kw.get('verifier'), temp=kw['sampling'].temperature,
                      tokens=host.tokens.tolist(), lengths=host.lengths.tolist(),
                      accepted=host.stats.accepted.tolist(), drafted=host.stats.drafted.tolist()))
    return out
  return wrapped
decode.generate = record(decode.generate, 'generate')
decode.speculative_generate = record(decode.speculative_generate, 'speculative')
config = ende.get_config(
  f'runlocal,pretrained={pair_dir},num_examples=4,batch_size=4,max_source_length=16,'
  f'max_new_tokens=10,gammas=3,drafters=flatter,timing_rounds=1,verifiers={verifiers},'
  f'mesh={"2x4" if multi else "auto"}')
rows = translate.run(config, f'{out}/job_{max(pid, 0)}')
results = dict(rows=len(rows), calls=calls)
if jax.process_index() == 0:
  with open(f'{out}/decode.json', 'w') as f:
    json.dump(results, f)
print('DONE')
"""

# Columns of a written row that do not depend on timing.
_EXACT = ('task', 'drafter', 'method', 'temp', 'gamma', 'alpha', 'block_efficiency', 'bleu')


def _tiny_pair(directory: pathlib.Path) -> pathlib.Path:
  """A pair directory: a random tiny T5 target over the 13.5M pair's tokenizer, and a drafter."""
  import jax

  from specdec_jax import checkpoints
  from specdec_jax.models import t5

  # One layer each side: every code path of a deeper model, at two thirds of its compile time.
  config = dataclasses.replace(
    t5.CONFIGS['tiny-v1.1'], vocab_size=8000, num_encoder_layers=1, num_decoder_layers=1
  )
  params = t5.init_params(jax.random.key(0), config)
  # Peaked next-token laws: a random tiny T5 spreads its mass almost evenly over 8,000 ids, where
  # logits summed in another order over 'model' shards move a CDF boundary past a uniform draw
  # about once in a thousand draws; peaked, the sampled tokens are the same on any mesh. The
  # drafter is the same network, less peaked: it agrees with the target often, not always, so
  # iterations accept some drafts and reject others (multi-token writes and rewinds both run).
  dense = params['decoder']['logits_dense']
  for name, scale in (('target', 30.0), ('drafter', 10.0)):
    scaled = {
      **params,
      'decoder': {**params['decoder'], 'logits_dense': {'kernel': dense['kernel'] * scale}},
    }
    checkpoints.save(t5.T5Model(config=config, params=scaled), directory / name)
  for name in ('spm.model', 'test.tsv'):
    shutil.copy(_PAIR / name, directory / name)
  manifest = {
    'target': 'target',
    'drafters': {'flatter': 'drafter'},
    'recommended': 'flatter',
    'gamma': {'0': 2, '1': 2},
  }
  (directory / 'pair.json').write_text(json.dumps(manifest))
  return directory


@pytest.mark.parametrize(
  'costs, verifiers',
  [
    # Default: block verification only, 4 programs a process (generate and speculative at each
    # temperature; compile-bound: each sharded program costs 9-16 s to compile here).
    ('fake', 'block'),
    pytest.param('measured', 'token,block', marks=pytest.mark.slow),
  ],
)
def test_two_processes_decode_and_run_the_main_job_as_one(tmp_path, costs, verifiers):
  pair = _tiny_pair(tmp_path / 'pair')
  helpers.run_as_two_hosts_and_one(_SCRIPT, tmp_path, str(pair), costs, verifiers, timeout=600)

  multi = json.loads((tmp_path / 'multi' / 'decode.json').read_text())
  one = json.loads((tmp_path / 'one' / 'decode.json').read_text())
  assert len(multi['calls']) == len(one['calls'])
  for got, want in zip(multi['calls'], one['calls']):
    assert got == want, (got['name'], got['verifier'], got['temp'])
  kinds = {(c['name'], c['verifier'], c['temp']) for c in one['calls']}
  assert kinds == {
    (name, verifier, temp)
    for temp in (0.0, 1.0)
    for name, verifier in [('generate', None)] + [('speculative', v) for v in verifiers.split(',')]
  }
  # Not vacuous: at temperature 1 some drafts were accepted and some rejected (multi-token
  # writes and rewinds both ran).
  spec = [c for c in one['calls'] if c['temp'] == 1.0 and c['verifier']]
  assert 0 < sum(sum(c['accepted']) for c in spec) < sum(sum(c['drafted']) for c in spec)

  # The main job: process 0 alone wrote the results; its rows are the one-device run's.
  written = json.loads((tmp_path / 'multi' / 'job_0' / 'results.json').read_text())
  reference = json.loads((tmp_path / 'one' / 'job_0' / 'results.json').read_text())
  assert len(written) == len(reference) == one['rows'] == 2 * (1 + len(verifiers.split(',')))
  for got, want in zip(written, reference):
    for column in _EXACT:
      if isinstance(want[column], float):
        np.testing.assert_allclose(got[column], want[column], rtol=1e-6, err_msg=column)
      else:
        assert got[column] == want[column], column
  assert not (tmp_path / 'multi' / 'job_1').exists()  # process 1 wrote nothing


@pytest.mark.parametrize(
  'module',
  [
    'specdec_jax.decode',
    'specdec_jax.measure.evaluation',
    'specdec_jax.pretrained',
    'specdec_jax.checkpoints',
    'experiments.translate',
  ],
)
def test_importing_starts_no_backend(module):
  # jax.distributed.initialize must run before any backend starts: a module that touches a
  # device at import would make every multi-host main fail.
  script = (
    f'import {module}\nfrom jax._src import xla_bridge\nassert not xla_bridge._backends, '
    f'"importing {module} started a JAX backend"'
  )
  result = subprocess.run(
    [sys.executable, '-c', script], cwd=_REPO, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0, result.stderr[-2000:]
