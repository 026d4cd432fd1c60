"""Plain helpers the tests share: tiny random T5 models, the shipped-pair checks, and what two or
more test files need (a test file imports helper modules, never another test file): the decode
tests' samplings, sources and tiny drafters, checkpoint fixtures and checks, verification's toy
simulation, verify_greedy's negative controls and verify_multipath's block-verification variants.

  from tests import helpers

  target = helpers.tiny_t5('tiny-v1.1')                     # t5.init_params(key(0), config)
  drafter = helpers.tiny_t5('tiny-v1.0', seed=1, num_encoder_layers=0, encoder_dim=32)

  @helpers.needs_pair('ende')                               # skipped where pretrained/ende is not
  def test_something_on_the_shipped_pair(): ...

Fixtures built on them (a loaded shipped pair, the tiny target/drafter pair) are in conftest.py.
"""

import contextlib
import dataclasses
import functools
import math
import os
import pathlib
import random
import socket
import subprocess
import sys
from fractions import Fraction
from unittest import mock

import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from benchmarks import machines
from specdec_jax import drafters, pretrained, verify, verify_greedy
from specdec_jax import sampling as sampling_lib
from specdec_jax import verify_multipath as vm
from specdec_jax.models import t5
from tests import chisquare
from tests import verify_oracle as oracle

# `t5.forward`, `encode` and `decode_forward` jitted: one compiled program per config and
# shapes, where op-by-op execution compiles each op (hundreds of small programs per call).
forward = jax.jit(t5.forward, static_argnames=('config',))
encode = jax.jit(t5.encode, static_argnames=('config',))
decode_forward = jax.jit(t5.decode_forward, static_argnames=('config',))


def tiny_t5(config: str | t5.T5Config = 'tiny-v1.1', seed: int = 0, **overrides) -> t5.T5Model:
  """A T5Model with `t5.init_params(jax.random.key(seed), config)`.

  Args:
    config: a name of `t5.CONFIGS` or a T5Config.
    seed: the init key's seed.
    **overrides: fields of the config to replace (`dataclasses.replace`), e.g. d_model=16.
  """
  if isinstance(config, str):
    config = t5.CONFIGS[config]
  if overrides:
    config = dataclasses.replace(config, **overrides)
  return t5.T5Model(config=config, params=t5.init_params(jax.random.key(seed), config))


# -------------------------------------------------------------------------------------------------
# The decode tests' samplings, sources and tiny T5 drafters (the fake Markov models they share are
# in fakes.py).

GREEDY = sampling_lib.SamplingConfig(temperature=0.0)
# GREEDY's tokens by the loops' general path: one-hot probability vectors, the named verifier.
ONE_HOT = sampling_lib.SamplingConfig(temperature=1.0, top_k=1)


def ragged_source(batch=4, length=7, seed=0, vocab=50):
  """Padded source ids in [2, vocab) whose rows have different lengths (the fake models ignore
  the source, but ids are checked against their vocabulary)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(2, vocab, size=(batch, length))
  lengths = np.maximum(length - np.arange(batch) * 2, 1)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  return jnp.asarray(ids * mask, jnp.int32), jnp.asarray(mask)


def ngram_drafter(order):
  """A bigram or trigram (every context kept) of a few sequences over fakes.TARGET's vocabulary."""
  seqs = [np.array([2, 3, 2, 1]), np.array([3, 3, 0, 2]), np.array([3, 2, 2, 0])]
  return drafters.NGramDrafter.fit(seqs, vocab_size=4, order=order, add_k=0.3, min_count=1)


def shared_encoder_drafter(target, seed=3):
  """A one-layer tiny T5 drafter that reads `target`'s encoder (num_encoder_layers=0)."""
  return tiny_t5(
    'tiny-v1.0', seed, num_encoder_layers=0, encoder_dim=target.config.d_model, d_model=16,
    d_kv=4, d_ff=32, num_decoder_layers=1,
  )  # fmt: skip


def eagle_drafter(target, seed=4):
  """An EAGLE-style drafter: reads `target`'s final decoder states (feature_dim)."""
  return tiny_t5(
    'tiny-v1.0', seed, num_encoder_layers=0, encoder_dim=target.config.d_model,
    feature_dim=target.config.d_model, d_model=16, d_kv=4, d_ff=32, num_decoder_layers=1,
  )  # fmt: skip


def tiny_block_t5(target, seed=6, **kw):
  """A tiny T5 block drafter (block_size 4, two layers) over `target`, reading its states."""
  kw = dict(feature_dim=target.config.d_model) | kw
  return tiny_t5(
    'tiny-v1.0', seed, num_encoder_layers=0, encoder_dim=target.config.d_model,
    block_size=4, d_model=16, d_kv=4, d_ff=32, num_decoder_layers=2, **kw,
  )  # fmt: skip


_EN = {'red': 'rote', 'big': 'große', 'old': 'alte', 'small': 'kleine'}
_NOUNS = {'cat': 'Katze', 'house': 'Haus', 'dog': 'Hund', 'tree': 'Baum'}
_VERBS = {'sees': 'sieht', 'likes': 'mag', 'finds': 'findet'}


def fixture_pairs(n: int, seed: int) -> list[tuple[str, str]]:
  """`n` synthetic EN->DE sentence pairs ('The red cat sees 12 birds.' -> 'Die rote Katze sieht
  12 Vögel.'): a corpus a tiny model learns in a few steps."""
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    adj, noun, verb = rng.choice(list(_EN)), rng.choice(list(_NOUNS)), rng.choice(list(_VERBS))
    count = rng.randint(2, 99)
    out.append(
      (
        f'The {adj} {noun} {verb} {count} birds.',
        f'Die {_EN[adj]} {_NOUNS[noun]} {_VERBS[verb]} {count} Vögel.',
      )
    )
  return out


def shipped(name: str = 'ende') -> bool:
  """Whether this checkout ships the pair `pretrained/<name>` (its manifest and its target)."""
  directory = pretrained.ROOT / name
  return (directory / 'pair.json').exists() and (directory / 'target').exists()


def needs_pair(name: str = 'ende'):
  """A mark that skips a test (or a parameter) where `pretrained/<name>` is not shipped."""
  return pytest.mark.skipif(not shipped(name), reason=f'pretrained/{name} not shipped')


# XLA:TPU's compiler (libtpu) compiles for abstract TPU devices on any host (benchmarks.machines).
try:
  import libtpu  # noqa: F401  (a small Python module beside libtpu.so)

  HAS_LIBTPU = True
except ImportError:
  HAS_LIBTPU = False
NO_LIBTPU = (
  "libtpu (XLA:TPU's compiler) is not installed: pip install -e '.[test]' brings it, or "
  + machines.install_line('tpu-v4')
)


def needs_libtpu(test):
  """Skips `test` (a test or a mark target) where libtpu is absent, naming the install line."""
  return pytest.mark.skipif(not HAS_LIBTPU, reason=NO_LIBTPU)(test)


_REPO = pathlib.Path(__file__).resolve().parents[1]


def _with_devices(devices: int) -> str:
  """This run's XLA_FLAGS (tests/conftest.py's among them) with `devices` host devices."""
  flags = os.environ.get('XLA_FLAGS', '')
  return f'{flags} --xla_force_host_platform_device_count={devices}'.strip()


def run_on_cpu_devices(script: str, done: str, *, devices: int = 8, timeout: int = 600) -> str:
  """Runs `script` in a fresh interpreter that sees `devices` CPU devices (the device count is
  fixed when JAX starts, so it cannot change in this process) and asserts it exited 0 having
  printed `done`; returns its stdout."""
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=_with_devices(devices),
  )
  result = subprocess.run(
    [sys.executable, '-c', script],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert result.returncode == 0 and done in result.stdout, result.stdout + result.stderr[-4000:]
  return result.stdout


def run_as_two_hosts_and_one(
  script: str, out: pathlib.Path, *args: str, timeout: int = 900
) -> None:
  """Runs `script` three times at once, as `python script PROCESS_ID PORT OUT_DIR *args`: as the
  2 processes of one job (PROCESS_ID 0 and 1, 4 CPU devices each, OUT_DIR `out/multi`, joining
  over localhost at PORT) and as one process on one device (PROCESS_ID -1, `out/one`); asserts
  that each exited 0 with DONE as its last line."""
  out.mkdir(parents=True, exist_ok=True)
  (out / 'script.py').write_text(script)
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(_REPO))
  procs = []
  for name, pid, devices in (('multi', 0, 4), ('multi', 1, 4), ('one', -1, 1)):
    (out / name).mkdir(exist_ok=True)
    procs.append(
      subprocess.Popen(
        [sys.executable, str(out / 'script.py'), str(pid), port, str(out / name), *args],
        cwd=_REPO,
        env=dict(env, XLA_FLAGS=_with_devices(devices)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, output in zip(procs, outputs):
    assert p.returncode == 0 and output.rstrip().endswith('DONE'), output[-6000:]


# -------------------------------------------------------------------------------------------------
# Checkpoints: what the checkpoint tests share (checkpoints_test, checkpoints_hf_test,
# checkpoints_t5x_test, checkpoints_sharded_test).

# Written by T5X itself and shipped in the repo (origin and license: tests/testdata/README.md).
T5X_TINY = _REPO / 'tests' / 'testdata' / 't5x_tiny' / 'checkpoint_0'
HF_TOL = 1e-4  # float32, ours (XLA) vs HF (PyTorch)


def flat_params(params) -> dict:
  """{'a/b/c': leaf} of a params tree."""
  return flax.traverse_util.flatten_dict(params, sep='/')


def assert_params_equal(got, want):
  """Same names, dtypes and bits."""
  got, want = flat_params(got), flat_params(want)
  assert sorted(got) == sorted(want)
  for name in want:
    assert np.asarray(got[name]).dtype == np.asarray(want[name]).dtype, name
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def random_t5(name: str, seed: int = 0, dtype: str = 'float32') -> t5.T5Model:
  """`t5.CONFIGS[name]` in `dtype` (config and params), params from `t5.init_params(key(seed))`."""
  config = dataclasses.replace(t5.CONFIGS[name], dtype=dtype)
  params = t5.init_params(jax.random.key(seed), config)
  return t5.T5Model(config=config, params=jax.tree.map(lambda x: x.astype(dtype), params))


def checkpoint_source(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """int64[2, 11] ids and mask; row 1 is padded after 7 tokens."""
  ids = np.random.default_rng(seed).integers(2, vocab, size=(2, 11))
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  return ids * mask, mask


def with_value(array, value, index: int = 3) -> np.ndarray:
  """A copy of `array` with one entry set to `value`."""
  array = np.array(array)
  array.flat[index] = value
  return array


def raises_naming(call, *needles: str) -> str:
  """Runs `call`, which must raise one ValueError whose one-line message holds every needle."""
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert '\n' not in message
  for needle in needles:
    assert needle in message, (needle, message)
  return message


def _chunk_shape(shape: tuple[int, ...], target_elements: int) -> list[int]:
  """T5X's `_choose_chunk_shape`: divisors of each dimension, largest dimension shrunk first."""
  factors = [[i for i in range(1, n + 1) if n % i == 0] for n in shape]
  while math.prod(f[-1] for f in factors) > target_elements:
    max(factors, key=lambda f: f[-1]).pop()
  return [f[-1] for f in factors]


def write_t5x_tensorstore_checkpoint(
  state: dict, directory: pathlib.Path, inline: tuple[str, ...] = (), storage: dict | None = None
):
  """Writes `state` ({'target': params, 'state': ...}) as T5X's Checkpointer does.

  Each array goes to a gzip-compressed zarr directory named by its dotted path
  ('target.encoder.layers_0.attention.key.kernel'), written by tensorstore; the msgpack
  `checkpoint` file holds {'version': 3, 'optimizer': state} with each such array replaced by its
  tensorstore spec, whose path is relative to the checkpoint directory. Scalars and the arrays
  named in `inline` stay in the msgpack, as T5X keeps unpartitioned arrays. `storage` overrides
  zarr metadata fields (dtype, compressor, order, ...) that T5X itself leaves at their defaults.
  """
  directory.mkdir(parents=True)

  def write(path: tuple[str, ...], array: np.ndarray):
    if array.ndim == 0 or '/'.join(path) in inline:
      return array
    spec = {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': '.'.join(path)},
      # T5X aims at 64 MiB chunks; 1024 elements make the larger arrays span several files.
      'metadata': {
        'compressor': {'id': 'gzip'},
        'shape': list(array.shape),
        'chunks': _chunk_shape(array.shape, target_elements=1024),
        **(storage or {}),
      },
    }
    if storage and 'dtype' in storage:
      del spec['dtype']  # the metadata's dtype (e.g. big-endian '>f4') is the stored one
    if array.ndim < 2:
      spec['metadata'].pop('order', None)  # tensorstore refuses 'F' for 1-D arrays (same as 'C')
    absolute = {**spec, 'kvstore': {'driver': 'file', 'path': str(directory / '.'.join(path))}}
    ts.open(absolute, create=True, open=True).result().write(array).result()
    return ts.Spec(spec).to_json()

  flat = flax.traverse_util.flatten_dict(state)
  written = flax.traverse_util.unflatten_dict({p: write(p, a) for p, a in flat.items()})
  contents = flax.serialization.msgpack_serialize({'version': 3, 'optimizer': written})
  (directory / 'checkpoint').write_bytes(contents)


def t5x_state(params) -> dict:
  """A T5X optimizer state dict: the params as `target`, plus Adafactor-like state to skip."""
  params = jax.tree.map(np.asarray, params)
  slots = jax.tree.map(lambda x: {'v_row': np.zeros((1,), x.dtype)}, params)
  return {'target': params, 'state': {'step': np.int32(7), 'param_states': slots}}


# -------------------------------------------------------------------------------------------------
# Verification's toy simulation (verify_test, verify_greedy_test, verify_multipath_test,
# verify_tree_test): toy models (tests/verify_oracle.py) as lookup tables, drafting and target
# continuation in numpy, and each output sequence as one integer code for the chi-square test.

TOY_ROWS = 200_000  # rows a kernel is run on, each drafting its own block


class ToyPair:
  """A target/drafter pair of context-dependent toy models with numpy lookup tables."""

  def __init__(self, target: oracle.Model, drafter: oracle.Model, gamma: int):
    self.target, self.drafter, self.gamma = target, drafter, gamma
    self.vocab = len(target[()])
    self.p_table = _toy_table(target, self.vocab, gamma + 1)
    self.q_table = _toy_table(drafter, self.vocab, gamma)


@functools.cache
def random_toy_pair(seed: int, vocab: int, gamma: int, shared: float = 0.25) -> ToyPair:
  """Random models; in a fraction `shared` of the contexts the drafter equals the target exactly,
  so zero residuals (p == q) occur."""
  rng = np.random.default_rng(seed)
  target = oracle.random_model(rng, vocab, gamma)
  drafter = oracle.random_model(rng, vocab, gamma)
  for prefix in drafter:
    if rng.random() < shared:
      drafter[prefix] = target[prefix]
  return ToyPair(target, drafter, gamma)


@functools.cache
def sun_toy_pair() -> ToyPair:
  """Sun et al. §3: Mb = [1/3, 2/3], Ms = [2/3, 1/3], context-free, G = 2."""
  target = oracle.context_free_model([Fraction(1, 3), Fraction(2, 3)], 2, 2)
  drafter = oracle.context_free_model([Fraction(2, 3), Fraction(1, 3)], 2, 2)
  return ToyPair(target, drafter, 2)


def code_offsets(vocab: int, max_len: int) -> np.ndarray:
  """offsets[l] = number of sequences shorter than l; the code space of lengths 0..max_len."""
  return np.concatenate([[0], np.cumsum(vocab ** np.arange(max_len + 1))])


def sequence_codes(seqs: np.ndarray, lengths, vocab: int) -> np.ndarray:
  """Unique code of each sequence `seqs[n, :lengths[n]]`: [N, L] ints -> [N]."""
  lengths = np.broadcast_to(lengths, seqs.shape[:1])
  position = np.arange(seqs.shape[1])
  exponent = lengths[:, None] - 1 - position
  digits = np.where(exponent >= 0, seqs * vocab ** np.maximum(exponent, 0), 0)
  return code_offsets(vocab, seqs.shape[1])[lengths] + digits.sum(axis=1)


def _toy_table(model: oracle.Model, vocab: int, num_lengths: int) -> np.ndarray:
  """float64[num codes, V]: the model's distribution after each prefix of length < num_lengths."""
  table = np.zeros((code_offsets(vocab, num_lengths)[num_lengths], vocab))
  for prefix, probs in model.items():
    if len(prefix) < num_lengths:
      table[sequence_codes(np.array([prefix or [0]]), len(prefix), vocab)[0]] = [
        float(x) for x in probs
      ]
  return table


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
  """Gumbel-max draw per row of float64 probs [N, V]; zero-probability tokens are never drawn."""
  with np.errstate(divide='ignore'):
    return np.argmax(np.log(probs) + rng.gumbel(size=probs.shape), axis=1)


@functools.cache
def toy_drafts(pair: ToyPair, seed: int):
  """Drafts TOY_ROWS rows autoregressively; returns tokens [N, G], f32 q [N, G, V], p [N, G+1, V].

  Cached: every test on the same (pair, seed) sees the same rows (read-only).
  """
  rng = np.random.default_rng(seed)
  num_rows = TOY_ROWS
  tokens = np.zeros((num_rows, pair.gamma), np.int64)
  for i in range(pair.gamma):
    tokens[:, i] = _draw(rng, pair.q_table[sequence_codes(tokens, i, pair.vocab)])
  draft_probs = np.stack(
    [pair.q_table[sequence_codes(tokens, i, pair.vocab)] for i in range(pair.gamma)], axis=1
  )
  target_probs = np.stack(
    [pair.p_table[sequence_codes(tokens, i, pair.vocab)] for i in range(pair.gamma + 1)], axis=1
  )
  return tokens, draft_probs.astype(np.float32), target_probs.astype(np.float32)


def emitted_sequences(tokens, tau, next_token) -> np.ndarray:
  """The emitted sequences `X^tau + (Y,)`, right-padded with zeros: [N, G+1]."""
  padded = np.pad(tokens, ((0, 0), (0, 1)))
  position = np.arange(padded.shape[1])
  return np.where(position < tau[:, None], padded, 0) + np.where(
    position == tau[:, None], next_token[:, None], 0
  )


def continue_with_target(pair: ToyPair, seqs, lengths, rng) -> np.ndarray:
  """Fills positions >= lengths[n] of seqs [N, G+1] by sampling from the target."""
  seqs = seqs.copy()
  for j in range(seqs.shape[1]):
    drawn = _draw(rng, pair.p_table[sequence_codes(seqs, j, pair.vocab)])
    seqs[:, j] = np.where(j < lengths, seqs[:, j], drawn)
  return seqs


def codes_pvalue(codes: np.ndarray, dist: oracle.Distribution, vocab: int, max_len: int):
  """p-value of the observed codes under the exact distribution; cells with expected count < 5
  are pooled, and any observation of a probability-0 sequence gives p = 0."""
  num_cells = code_offsets(vocab, max_len)[max_len + 1]
  probs = np.zeros(num_cells)
  for seq, prob in dist.items():
    probs[sequence_codes(np.array([seq]), len(seq), vocab)[0]] = float(prob)
  return chisquare.pvalue(np.bincount(codes, minlength=num_cells), probs)


DEGENERATE_KINDS = ('dirichlet', 'one_hot', 'uniform', 'sparse', 'tiny', 'same')


def degenerate_probs(rng: np.random.Generator, kinds, shape, like=None) -> np.ndarray:
  """f32 probability rows of the given kinds; 'same' copies the row of `like` (p == q)."""
  vocab = shape[-1]
  rows = []
  for index, kind in zip(np.ndindex(*shape[:-1]), kinds):
    if kind == 'same' and like is not None and index[1] < like.shape[1]:
      rows.append(like[index].astype(np.float64))
      continue
    if kind == 'one_hot':
      row = np.eye(vocab)[rng.integers(vocab)]
    elif kind == 'uniform':
      row = np.ones(vocab)
    elif kind == 'sparse':
      row = rng.dirichlet(np.ones(vocab)) * (rng.random(vocab) < 0.5)
      row[rng.integers(vocab)] += 0.1
    elif kind == 'tiny':
      row = rng.choice([0.0, 1e-30, 1e-38, 1e-44, 1e-7], size=vocab)
      row[rng.integers(vocab)] = 1.0
    else:
      row = rng.dirichlet(np.full(vocab, 0.3))
    rows.append(row / row.sum())
  return np.array(rows).reshape(shape).astype(np.float32)


# -------------------------------------------------------------------------------------------------
# verify_greedy's negative controls (verify_greedy_test, decode_greedy_block_test): one piece of
# verify_greedy swapped for a plausible bug (applied by `patched_verify_greedy`).

_VERIFY_GREEDY_PIECES = {
  name: getattr(verify_greedy, name)
  for name in ('advance_levels', 'path_log_weights', 'correction')
}


def _state_dropped(draft_probs, target_probs, levels, *unused):
  """Bug: the residual state dropped after a rejection (each iteration verifies against the
  target again): a lossy drop-in rule, one of docs/method.md section 11's negative controls."""
  return jnp.full_like(levels, jnp.inf)


def _w_clipped(draft_tokens, draft_probs, law):
  """Bug: w clipped as block verification clips it, min(1, w_{i-1} r_i) (log: S_i - max S_j)."""
  log_w = _VERIFY_GREEDY_PIECES['path_log_weights'](draft_tokens, draft_probs, law)
  return log_w - jax.lax.cummax(log_w, axis=1)


def _block_residual(law_row, q_row, log_w):
  """Bug: Y drawn from block verification's residual, (min(1, w_tau) L - q)_+."""
  return _VERIFY_GREEDY_PIECES['correction'](law_row, q_row, jnp.minimum(log_w, 0.0))


VERIFY_GREEDY_CONTROLS = {
  'state_dropped': ('advance_levels', _state_dropped),
  'w_clipped': ('path_log_weights', _w_clipped),
  'block_residual': ('correction', _block_residual),
}


@contextlib.contextmanager
def patched_verify_greedy(control: str | None):
  """verify_greedy with one piece replaced (None: as is); the jitted kernels are traced again."""
  if control is None:
    yield
    return
  name, fn = VERIFY_GREEDY_CONTROLS[control]
  setattr(verify_greedy, name, fn)
  jax.clear_caches()
  try:
    yield
  finally:
    setattr(verify_greedy, name, _VERIFY_GREEDY_PIECES[name])
    jax.clear_caches()


# -------------------------------------------------------------------------------------------------
# verify_multipath's block-verification variants (verify_multipath_test, decode_multipath_test):
# a negative control plants one bug in a public kernel, pieces of verify_multipath swapped while
# the kernel is traced (`swapped_multipath`), or Y drawn by block verification assembled from
# verify's public pieces (`_gbv_block_verify`) with another residual. With nothing swapped, the
# runs are the public kernels bit for bit (verify_multipath_test's
# test_unswapped_runs_are_the_public_kernels), so each control differs from a public kernel by its
# planted bug alone.

_FLOAT32_TINY = jnp.finfo(jnp.float32).tiny
_MULTIPATH_SKEW_ROW = vm.skew_row  # the original, for the swapped piece


@contextlib.contextmanager
def swapped_multipath(pieces):
  """verify_multipath with `pieces` ({name: function}) in place of its own, while a kernel is
  traced (outside any jit cache of the kernel itself)."""
  with contextlib.ExitStack() as stack:
    for name, fn in pieces.items():
      stack.enter_context(mock.patch.object(vm, name, fn))
    yield


def capped_key(p, q):
  """The reference code's token key `min(1, p/q)` (q = 0 read as the smallest normal float, as
  `vm.order_key` does): ties at 1 wherever p >= q."""
  return jnp.minimum(p / jnp.maximum(q, _FLOAT32_TINY), 1.0)


def _code_tie_select(children, keys, alive):
  """The public reference code's selection: the first child in path order with a strictly larger
  key (ties go to the earlier path, while the law breaks them by token id)."""
  child_keys = jnp.take_along_axis(keys, children, axis=1)
  best, best_key = jnp.full(children.shape[:1], -1), jnp.full(children.shape[:1], -jnp.inf)
  for k in range(children.shape[1]):
    better = alive[:, k] & (child_keys[:, k] > best_key)
    best = jnp.where(better, children[:, k], best)
    best_key = jnp.where(better, child_keys[:, k], best_key)
  return best


def _log_p(p, q):
  """With `_skew_under_ratio`, a bug: select the child the target likes most, while the law
  assumes the ratio order."""
  del q
  return jnp.log(p)


def _skew_under_ratio(q_row, keys, *rest):
  """The law under the ratio order when `order_key` gives log p: log p - log q, as order_key."""
  return _MULTIPATH_SKEW_ROW(q_row, keys - jnp.log(jnp.maximum(q_row, _FLOAT32_TINY)), *rest)


# name: (pieces of verify_multipath swapped, Y's residual from the drafter's own q, not q_hat).
# 'block/capped' is not a bug: the law is exact under any strict order the selection shares.
GBV_VARIANTS = {
  'block': ({}, False),
  'block/capped': ({'order_key': capped_key}, False),
  'block/code_tie_rule': ({'order_key': capped_key, 'select_child': _code_tie_select}, False),
  'block/residual_from_q': ({}, True),
  'block/select_by_p': ({'order_key': _log_p, 'skew_row': _skew_under_ratio}, False),
}


def gbv_select_path(tokens, q, p, variant='block'):
  """`vm.select_path` with the variant's pieces swapped (call it inside a jit: it is traced)."""
  with swapped_multipath(GBV_VARIANTS[variant][0]):
    return vm.select_path(tokens, q, p)


def _gbv_block_acceptance(selected, q_hat, p_selected):
  """Block verification's weights `w_0..w_G` and `h_1..h_G` on the selected path."""
  weights = verify.block_weights(*verify.probs_of_drafts(selected, q_hat, p_selected))
  return weights, verify.block_acceptance(weights, q_hat, p_selected)


def _gbv_block_verify(rng, selected, q_hat, p_selected, residual_q):
  """`verify.block_verify` assembled from its public pieces, with Y's residual from
  `residual_q`."""
  weights, acceptance = _gbv_block_acceptance(selected, q_hat, p_selected)
  eta_rng, next_rng = jax.random.split(rng)
  accepted = jax.random.uniform(eta_rng, acceptance.shape, jnp.float32) < acceptance
  tau = verify.longest_accepted_block(accepted)
  weight = jnp.take_along_axis(weights, tau[:, None], axis=1)[:, 0]
  return tau, verify.sample_next(next_rng, tau, weight, residual_q, p_selected)


@functools.partial(jax.jit, static_argnames=('variant',))
def gbv_plan(tokens, q, p, variant):
  path, selected, q_hat, p_selected = gbv_select_path(tokens, q, p, variant)
  q_raw = jnp.take_along_axis(q, path[:, None, None, None], axis=1)[:, 0]
  residual_q = q_raw if GBV_VARIANTS[variant][1] else q_hat
  weights, acceptance = _gbv_block_acceptance(selected, q_hat, p_selected)
  return path, selected, q_hat, p_selected, residual_q, weights, acceptance


@functools.partial(jax.jit, static_argnames=('variant',))
def gbv_run(rng, tokens, q, p, variant):
  path, selected, q_hat, p_selected, residual_q, _, _ = gbv_plan(tokens, q, p, variant)
  tau, y = _gbv_block_verify(rng, selected, q_hat, p_selected, residual_q)
  return vm.MultipathResult(path, tau, y)
