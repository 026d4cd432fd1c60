"""Seeded identity of every decode loop: the tripwire of a refactor that must change nothing.

Each case decodes a batch with fixed seeds and compares every output array (tokens, lengths,
every `DecodeStats` field, the trace) with `tests/testdata/loop_golden.npz`, bit for bit. The
cases cover each verifier at temperature 0 and at T > 0 with top-k / top-p, K = 2 paths, draft
stop, an unrolled draft, the argmax proposal, the trace, every tree builder, an n-gram drafter,
`generate`, and the tiny T5 pair with each kind of drafter (plain, shared encoder, EAGLE-style,
block), on batches whose rows end in different iterations.

A commit meant to change numerics re-records the file and says what moved:

  SPECDEC_RECORD_GOLDEN=1 pytest -n 0 tests/loop_golden_test.py
"""

import dataclasses
import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, drafters
from specdec_jax import sampling as sampling_lib
from tests import fakes, helpers

GOLDEN = pathlib.Path(__file__).parent / 'testdata' / 'loop_golden.npz'
RECORD = os.environ.get('SPECDEC_RECORD_GOLDEN') == '1'

GREEDY = sampling_lib.SamplingConfig(temperature=0.0)
TOP_K = sampling_lib.SamplingConfig(temperature=0.8, top_k=3)
TOP_P = sampling_lib.SamplingConfig(temperature=1.0, top_p=0.9)
ROWS, LENGTH = 8, 10  # fakes: rows end at EOS in different iterations at T > 0


@functools.cache
def _fakes():
  target = fakes.random_markov(seed=1)
  drafter = fakes.random_markov(seed=2)
  seqs = np.random.default_rng(0).integers(0, 4, size=(64, 8))
  return {
    'target': target,
    'drafter': drafter,
    'state_target': fakes.with_states(target),
    'block': fakes.random_block_drafter(seed=5),
    'bigram': drafters.NGramDrafter.fit(list(seqs), vocab_size=4, order=2, min_count=1),
    'trigram': drafters.NGramDrafter.fit(list(seqs), vocab_size=4, order=3, min_count=1),
  }


@functools.cache
def _t5():
  target = helpers.tiny_t5('tiny-v1.1', seed=0)
  return {
    'target': target,
    'drafter': helpers.tiny_t5('tiny-v1.0', seed=1),
    'shared': helpers.shared_encoder_drafter(target),
    'eagle': helpers.eagle_drafter(target),
    'block': helpers.tiny_block_t5(target),
  }


def _source(batch, vocab, seed=0, length=7):
  rng = np.random.default_rng(seed)
  ids = rng.integers(2, vocab, size=(batch, length)).astype(np.int32)
  lengths = rng.integers(2, length + 1, size=batch)
  mask = np.arange(length)[None] < lengths[:, None]
  return jnp.asarray(np.where(mask, ids, 0)), jnp.asarray(mask)


@dataclasses.dataclass(frozen=True)
class Case:
  models: str  # 'fake' | 't5'
  target: str
  drafter: str | None  # None: generate
  sampling: sampling_lib.SamplingConfig
  kw: tuple = ()
  seed: int = 0

  def run(self):
    zoo = _fakes() if self.models == 'fake' else _t5()
    if self.models == 'fake':
      ids, mask = jnp.zeros((ROWS, 1), jnp.int32), jnp.ones((ROWS, 1), jnp.int32)
      length = LENGTH
    else:
      ids, mask = _source(4, zoo['target'].config.vocab_size)
      length = 12
    rng = jax.random.key(self.seed)
    kw = dict(self.kw)
    if self.drafter is None:
      return decode.generate(
        zoo[self.target], ids, mask, sampling=self.sampling, max_new_tokens=length, rng=rng
      )
    return decode.speculative_generate(
      zoo[self.target], zoo[self.drafter], ids, mask, sampling=self.sampling,
      max_new_tokens=length, rng=rng, **kw,
    )  # fmt: skip


def _cases() -> dict[str, Case]:
  cases = {}
  samplings = {'greedy': GREEDY, 'topk': TOP_K, 'topp': TOP_P}

  def add(name, *args, **kw):
    cases[name] = Case(*args, kw=tuple(sorted(kw.items())))

  for s_name, s in samplings.items():
    add(f'fake/generate/{s_name}', 'fake', 'target', None, s)
    for verifier in ('token', 'block', 'greedy_block'):
      add(f'fake/{verifier}/{s_name}', 'fake', 'target', 'drafter', s, gamma=3, verifier=verifier)
    for verifier in ('token', 'block'):
      add(
        f'fake/{verifier}/k2/{s_name}', 'fake', 'target', 'drafter', s,
        gamma=2, verifier=verifier, num_drafts=2,
      )  # fmt: skip
      add(
        f'fake/block_drafter/{verifier}/{s_name}', 'fake', 'state_target', 'block', s,
        gamma=3, verifier=verifier,
      )  # fmt: skip
    add(f'fake/draft_stop/{s_name}', 'fake', 'target', 'drafter', s, gamma=3, draft_stop=0.4)
    add(f'fake/trigram/{s_name}', 'fake', 'target', 'trigram', s, gamma=3)
    add(
      f'fake/tree_block/{s_name}', 'fake', 'state_target', 'block', s,
      gamma=2, tree=decode.TreeSpec(num_nodes=6),
    )  # fmt: skip
    add(
      f'fake/tree_topk/{s_name}', 'fake', 'target', 'drafter', s,
      gamma=2, tree=decode.TreeSpec(num_nodes=5, builder='topk', top_k=2),
    )  # fmt: skip
    add(
      f'fake/tree_sampled/{s_name}', 'fake', 'state_target', 'block', s,
      gamma=2, tree=decode.TreeSpec(num_nodes=13, builder='sampled', branching=(3, 3)),
    )  # fmt: skip
  for s_name, s in (('greedy', GREEDY), ('topk', TOP_K)):
    add(f'fake/unroll/{s_name}', 'fake', 'target', 'drafter', s, gamma=3, unroll_draft=True)
    add(f'fake/trace/{s_name}', 'fake', 'target', 'drafter', s, gamma=3, trace=True)
    add(f'fake/bigram/k2/{s_name}', 'fake', 'target', 'bigram', s, gamma=2, num_drafts=2)
  for verifier in ('token', 'block'):
    add(f'fake/argmax/{verifier}', 'fake', 'target', 'drafter', TOP_P, gamma=3, proposal='argmax')
    add(
      f'fake/block_drafter/argmax/{verifier}', 'fake', 'state_target', 'block', TOP_P,
      gamma=3, verifier=verifier, proposal='argmax',
    )  # fmt: skip
  add('fake/block_drafter/k2/topk', 'fake', 'state_target', 'block', TOP_K, gamma=2, num_drafts=2)
  add(
    'fake/trace/block_drafter/topp', 'fake', 'state_target', 'block', TOP_P,
    gamma=3, verifier='block', trace=True,
  )  # fmt: skip

  # The tiny T5 pair, one case per kind of drafter and loop shape.
  for s_name, s in (('greedy', GREEDY), ('topk', TOP_K)):
    add(f't5/generate/{s_name}', 't5', 'target', None, s)
    add(f't5/token/{s_name}', 't5', 'target', 'drafter', s, gamma=3)
    add(f't5/block_drafter/{s_name}', 't5', 'target', 'block', s, gamma=3, verifier='block')
    add(
      f't5/tree_block/{s_name}', 't5', 'target', 'block', s,
      gamma=3, tree=decode.TreeSpec(num_nodes=8),
    )  # fmt: skip
  add('t5/k2/topp', 't5', 'target', 'drafter', TOP_P, gamma=2, num_drafts=2, verifier='block')
  add('t5/shared/topp', 't5', 'target', 'shared', TOP_P, gamma=3)
  add('t5/eagle/topk', 't5', 'target', 'eagle', TOP_K, gamma=3, verifier='block')
  add('t5/greedy_block/topp', 't5', 'target', 'drafter', TOP_P, gamma=3, verifier='greedy_block')
  add(
    't5/tree_topk/topp', 't5', 'target', 'drafter', TOP_P,
    gamma=2, tree=decode.TreeSpec(num_nodes=5, builder='topk', top_k=2),
  )  # fmt: skip
  add(
    't5/tree_sampled/topp', 't5', 'target', 'block', TOP_P,
    gamma=2, tree=decode.TreeSpec(num_nodes=7, builder='sampled', branching=(2, 2)),
  )  # fmt: skip
  return cases


CASES = _cases()
# The default suite runs these (one of each loop shape and carried state); `pytest -m slow` the
# rest (each case compiles its own program: all of them take ~4 CPU-minutes).
DEFAULT = (
  'fake/token/topp', 'fake/block/k2/topk', 'fake/greedy_block/topp', 'fake/draft_stop/topk',
  'fake/trace/topk', 'fake/tree_sampled/topp', 'fake/tree_topk/greedy', 't5/tree_block/topk',
)  # fmt: skip


def _arrays(out) -> dict[str, np.ndarray]:
  arrays = {'tokens': out.tokens, 'lengths': out.lengths}
  for field in dataclasses.fields(out.stats):
    arrays[f'stats.{field.name}'] = getattr(out.stats, field.name)
  if out.trace is not None:
    for field in dataclasses.fields(out.trace):
      arrays[f'trace.{field.name}'] = getattr(out.trace, field.name)
  return {k: np.asarray(v) for k, v in arrays.items()}


@functools.cache
def _golden() -> dict[str, np.ndarray]:
  with np.load(GOLDEN) as f:
    return dict(f)


def _record() -> None:
  """Decodes every case and writes the golden file."""
  arrays = {}
  for name, case in CASES.items():
    for key, value in _arrays(case.run()).items():
      arrays[f'{name}:{key}'] = value
  GOLDEN.parent.mkdir(exist_ok=True)
  np.savez_compressed(GOLDEN, **arrays)


@pytest.mark.skipif(not RECORD, reason='records only when SPECDEC_RECORD_GOLDEN=1')
def test_record():
  _record()


@pytest.mark.skipif(RECORD, reason='recording')
@pytest.mark.parametrize(
  'name', [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CASES]
)
def test_loop_output_is_bit_identical_to_the_golden_file(name):
  golden = {k.split(':', 1)[1]: v for k, v in _golden().items() if k.split(':', 1)[0] == name}
  assert golden, f'{name} is not in {GOLDEN.name}: re-record it (module docstring)'
  got = _arrays(CASES[name].run())
  assert sorted(got) == sorted(golden)
  for key, want in golden.items():
    assert got[key].dtype == want.dtype, key
    np.testing.assert_array_equal(got[key], want, err_msg=f'{name}:{key}')


def test_the_cases_do_what_they_say():
  """Not a vacuous file: the sampled cases kept and rejected drafts, and rows ended apart."""
  golden = _golden()
  lengths = golden['fake/token/topp:lengths']
  assert len(set(lengths.tolist())) > 1  # rows ended in different iterations
  accepted = golden['fake/token/topp:stats.accepted'].sum()
  assert 0 < accepted < golden['fake/token/topp:stats.drafted'].sum()
  assert golden['fake/trace/topk:trace.num_accepted'].sum() > 0  # the trace was recorded
