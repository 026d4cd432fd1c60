"""Fixtures shared by the tests, and the run's compilation cache; the plain functions behind the
fixtures are in tests/helpers.py."""

import os
import re
import shutil
import tempfile

import jax
import pytest
from jax._src import compiler as jax_compiler

from benchmarks import machines
from specdec_jax import pretrained
from specdec_jax.measure import job_config
from tests import helpers

_CACHE_ENV = 'JAX_COMPILATION_CACHE_DIR'
# A test compiles far more than it runs (tiny shapes, a program run once or a few times), so the
# tests' XLA:CPU compiles cheaply; a flag the user sets in XLA_FLAGS wins over each of these:
# - level 0: LLVM's optimization off, XLA's own passes (fusion, layout) as they are: two test
#   files on two workers ran in 0.84 of the time, paired;
# - XLA:CPU's older elemental fusion emitters instead of its MLIR fusion emitters: the same
#   fusions from a lighter code generator, 0.59-0.69 of the CPU time of decode_block_test and the
#   golden file's default cases (which stay bit-identical; docs/performance.md, "The default test
#   suite's time").
# No fast math either way; benchmarks and experiments are untouched (they time programs).
_TEST_XLA_FLAGS = {
  'xla_backend_optimization_level': '0',
  'xla_cpu_use_fusion_emitters': 'false',
}
# A level of the user's own (this run's workers inherit the suite's 0 from the controller).
_USER_SET_LEVEL = re.search(
  r'xla_backend_optimization_level=(?!0\b)', os.environ.get('XLA_FLAGS', '')
)


def pytest_configure(config):
  """One XLA compilation cache for the whole run, empty at its start, shared by the xdist workers
  and the processes tests start (they inherit the environment): a program compiled once in the
  run is loaded from disk after, e.g. the unpatched loops a negative control's
  `jax.clear_caches()` throws away. Programs are keyed by their HLO, flags and JAX version, so a
  hit is the same program. (Its gain was within this machine's noise when measured; see the
  issue 26 note.) A cache the user set is kept."""
  flags = os.environ.get('XLA_FLAGS', '')
  for name, value in _TEST_XLA_FLAGS.items():  # before the backend starts, below
    if name not in flags:
      flags = f'{flags} --{name}={value}'.strip()
  os.environ['XLA_FLAGS'] = flags
  if not hasattr(config, 'workerinput') and _CACHE_ENV not in os.environ:
    config.jit_cache_dir = os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix='specdec_jax_jit_')
    os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0.2'
  # This process imported JAX before this hook (through the fixtures' imports): set it here too.
  jax.config.update('jax_compilation_cache_dir', os.environ[_CACHE_ENV])
  jax.config.update(
    'jax_persistent_cache_min_compile_time_secs',
    float(os.environ.get('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', 1.0)),
  )
  # The first backend JAX starts here; with libtpu installed (the test extra) it tries the TPU's
  # too, and on a host without one libtpu would warn on stderr.
  with machines.quiet_libtpu():
    backend = jax.default_backend()
  # The tests compare float32 paths (a chunked decode with the one-pass forward, a narrowed pass
  # with the full one) at 1e-5. On a GPU (TF32) or TPU (bfloat16 passes) a float32 matmul is not
  # float32 by default, and the two paths then differ by ~1e-3 (seen on an H200, 2026-11-26).
  if backend != 'cpu':
    jax.config.update('jax_default_matmul_precision', 'highest')


# The heaviest files (CPU-seconds by pytest --durations on an AMD EPYC Zen 3, 2026-11-25) first:
# the two xdist workers take whole files in collection order, and a heavy file left for last runs
# while the other worker has nothing left to take.
_HEAVIEST_FIRST = (
  'tpu_compile_test.py',
  'tpu_paper_test.py',
  'multihost_training_test.py',
  'multihost_test.py',
  'decode_test.py',
  'translate_test.py',
  'decode_multipath_test.py',
  'timing_test.py',
  'decode_draft_stop_test.py',
  'decode_spec_test.py',
  't5_growth_test.py',
  't5_test.py',
  'decode_lowering_test.py',
  'verify_multipath_test.py',
  'verify_test.py',
  'train_test.py',
  'checkpoints_test.py',
  'distill_test.py',
  'checkpoint_pair_test.py',
  'decode_output_test.py',
  'checkpoints_sharded_test.py',
)


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(_HEAVIEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


def pytest_unconfigure(config):
  if getattr(config, 'jit_cache_dir', None):
    shutil.rmtree(config.jit_cache_dir, ignore_errors=True)


@pytest.fixture
def xla_cpu_defaults():
  """Compiles inside the test with XLA:CPU's own fusion emitters, not the suite's lighter ones
  (`_TEST_XLA_FLAGS`): for tests that read the structure of an optimized CPU program (its loops,
  its launches), which is XLA's default compiler's."""
  compile_ = jax.stages.Lowered.compile

  def default_compile(self, compiler_options=None, **kw):
    options = {'xla_cpu_use_fusion_emitters': True, **(compiler_options or {})}
    return compile_(self, compiler_options=options, **kw)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax.stages.Lowered, 'compile', default_compile)
    yield


@pytest.fixture(autouse=True)
def _xla_cpu_optimized_for_many_rows(request):
  """A test marked `many_rows` (it runs its programs over many rows: chi-square tests over whole
  sequences with an n-gram or Markov drafter) compiles with LLVM's optimization at level 1, not the
  suite's 0 (`_TEST_XLA_FLAGS`): the faster code pays for the slower compile there (the n-gram
  chi-square tests and their control took 0.59 of the CPU time; on most other tests level 1 lost:
  docs/performance.md, "The default test suite's time"). Patches JAX's private
  `compiler.get_compile_options`, where every jit's XLA options are made; the compilation cache
  keys on the options, so a program compiled one way is never read back for the other. A level
  the user sets in XLA_FLAGS wins."""
  if request.node.get_closest_marker('many_rows') is None or _USER_SET_LEVEL:
    yield
    return
  get_options = jax_compiler.get_compile_options

  def optimized(*args, **kwargs):
    options = get_options(*args, **kwargs)
    options.executable_build_options.debug_options.xla_backend_optimization_level = 1
    return options

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax_compiler, 'get_compile_options', optimized)
    yield


_LOADED_PAIRS = {}


@pytest.fixture
def pairs_loaded_once(monkeypatch):
  """`job_config.load_pair`, the main job's loading, once a worker for each pair it loads: for
  tests that only read the pair (its loading is tested in pretrained_test, checkpoint_pair_test
  and grown_pair_test). A pair is keyed by what it depends on: the config's
  `job_config.PAIR_FIELDS`, the decoder layout the config asks on this mesh, and the mesh."""
  load = job_config.load_pair

  def once(config, mesh):
    fields = tuple(repr(config.get(name)) for name in job_config.PAIR_FIELDS)
    key = (*fields, job_config.decoder_layout(config, mesh), mesh)
    if key not in _LOADED_PAIRS:
      _LOADED_PAIRS[key] = load(config, mesh)
    return _LOADED_PAIRS[key]

  monkeypatch.setattr(job_config, 'load_pair', once)


@pytest.fixture(scope='session')
def ende_pair() -> pretrained.Pair:
  """The shipped `pretrained/ende` pair, loaded once per session (tests only read it); skips the
  test where this checkout does not ship it."""
  if not helpers.shipped('ende'):
    pytest.skip('pretrained/ende not shipped')
  return pretrained.load('ende')


@pytest.fixture(scope='session')
def tiny_pair():
  """(target, drafter): random tiny-v1.1 (seed 0) and tiny-v1.0 (seed 1), one vocabulary."""
  return helpers.tiny_t5('tiny-v1.1', seed=0), helpers.tiny_t5('tiny-v1.0', seed=1)
