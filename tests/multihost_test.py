"""Two processes x 4 CPU devices on one machine, as hosts of a TPU slice are.

Each process calls `sharding.maybe_initialize_distributed('localhost:PORT', 2, id)` (gloo
collectives between the processes), builds a global (data=2, model=4) mesh over all 8 devices,
and runs `generate`, `speculative_generate` (both verifiers, temperatures 0 and 1) and the main
job (`experiments.translate.run`) on a tiny pair. A third process runs the same on one device.
Tokens, lengths, accepted counts and every written row's deterministic columns must be equal;
only process 0 writes files.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]
_PAIR = _REPO / 'pretrained' / 'ende'

# Run as `python script.py PROCESS_ID PORT OUT_DIR PAIR_DIR` (PROCESS_ID -1: one process, one
# device). Prints nothing but a last line DONE; writes OUT_DIR/decode.json and the main job's
# files under OUT_DIR/job_0 (process 0 only).
_SCRIPT = r"""
import contextlib, json, sys
pid, port, out, pair_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
from specdec_jax import sharding
if pid >= 0:
  assert sharding.maybe_initialize_distributed(f'localhost:{port}', 2, pid)
import jax, numpy as np
from specdec_jax import decode, pretrained
from specdec_jax.sampling import SamplingConfig
from experiments import translate
from experiments.configs import ende

multi = pid >= 0
assert jax.process_count() == (2 if multi else 1) and jax.device_count() == (8 if multi else 1)
mesh = sharding.make_mesh(2, 4) if multi else None
pair = pretrained.load(pair_dir, mesh=mesh)
sources = [s for s, _ in pair.test_pairs()[:4]]
encode = lambda rows: pair.tokenizer.encode_batch([sources[i] for i in rows], 16, truncate=True)
if multi:
  ids, mask = sharding.global_batch(encode, 4, mesh)
  # Each process made only its own two rows.
  assert sharding.local_rows(4, mesh) == range(2 * pid, 2 * pid + 2)
  assert not ids.is_fully_addressable
else:
  ids, mask = encode(range(4))
results = {}
for temperature in (0.0, 1.0):
  kw = dict(sampling=SamplingConfig(temperature=temperature), max_new_tokens=10,
            rng=jax.random.key(3))
  for method in ('autoregressive', 'token', 'block'):
    with jax.set_mesh(mesh) if multi else contextlib.nullcontext():
      run = (decode.generate(pair.target, ids, mask, **kw) if method == 'autoregressive' else
             decode.speculative_generate(pair.target, pair.drafters['bigram'], ids, mask,
                                         gamma=3, verifier=method, **kw))
    host = decode.to_host(run)  # every process gets the whole batch
    results[f'{method}/{temperature}'] = dict(
      tokens=host.tokens.tolist(), lengths=host.lengths.tolist(),
      accepted=host.stats.accepted.tolist())
config = ende.get_config(
  f'runlocal,pretrained={pair_dir},num_examples=4,batch_size=4,max_source_length=16,'
  f'max_new_tokens=10,gammas=3,drafters=bigram,timing_rounds=1,'
  f'mesh={"2x4" if multi else "auto"}')  # the shapes above: their programs are compiled already
rows = translate.run(config, f'{out}/job_{max(pid, 0)}')
results['rows'] = len(rows)
if jax.process_index() == 0:
  with open(f'{out}/decode.json', 'w') as f:
    json.dump(results, f)
print('DONE')
"""

# Columns of a written row that do not depend on timing.
_EXACT = ('task', 'drafter', 'method', 'temp', 'gamma', 'alpha', 'block_efficiency', 'bleu')


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _tiny_pair(directory: pathlib.Path) -> pathlib.Path:
  """A pair directory: a random tiny T5 target over the 13.5M pair's tokenizer, its bigram."""
  import jax

  from specdec_jax import checkpoints
  from specdec_jax.models import t5

  config = t5.CONFIGS['tiny-v1.1']
  config = type(config)(**{**config.__dict__, 'vocab_size': 8000})
  params = t5.init_params(jax.random.key(0), config)
  checkpoints.save(t5.T5Model(config=config, params=params), directory / 'target')
  for name in ('spm.model', 'bigram.npz', 'test.tsv'):
    shutil.copy(_PAIR / name, directory / name)
  manifest = {
    'target': 'target',
    'drafters': {'bigram': 'bigram.npz'},
    'recommended': 'bigram',
    'gamma': {'0': 2, '1': 2},
  }
  (directory / 'pair.json').write_text(json.dumps(manifest))
  return directory


def test_two_processes_decode_and_run_the_main_job_as_one(tmp_path):
  pair = _tiny_pair(tmp_path / 'pair')
  script = tmp_path / 'script.py'
  script.write_text(_SCRIPT)
  port = str(_free_port())
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(_REPO))
  multi_env = dict(env, XLA_FLAGS='--xla_force_host_platform_device_count=4')
  one_env = dict(env, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  runs = {
    'multi': [(multi_env, str(i)) for i in (0, 1)],
    'one': [(one_env, '-1')],
  }
  procs = []
  for name, members in runs.items():
    (tmp_path / name).mkdir()
    for run_env, pid in members:
      args = [sys.executable, str(script), pid, port, str(tmp_path / name), str(pair)]
      procs.append(
        subprocess.Popen(
          args, cwd=_REPO, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
      )
  try:
    outputs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, output in zip(procs, outputs):
    assert p.returncode == 0 and output.rstrip().endswith('DONE'), output[-4000:]

  multi = json.loads((tmp_path / 'multi' / 'decode.json').read_text())
  one = json.loads((tmp_path / 'one' / 'decode.json').read_text())
  assert multi.keys() == one.keys()
  for case in one:
    assert multi[case] == one[case], case
  # Not vacuous: drafts were accepted at temperature 1 (multi-token writes and rewinds ran).
  assert sum(one['token/1.0']['accepted']) > 0

  # The main job: process 0 alone wrote the results; its rows are the one-device run's.
  written = json.loads((tmp_path / 'multi' / 'job_0' / 'results.json').read_text())
  reference = json.loads((tmp_path / 'one' / 'job_0' / 'results.json').read_text())
  assert len(written) == len(reference) == one['rows'] == 6
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
    'specdec_jax.evaluation',
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
