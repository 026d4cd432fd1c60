"""`unroll_draft`: the speculative loop with its draft scan unrolled (issue 34, item 4).

The same program's numbers without the scan's while loop: the same tokens as the scan, greedy
(both `generate`'s) and sampled with one key, and one while loop fewer in the lowered program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing

GREEDY = sampling_lib.SamplingConfig(temperature=0.0)
SAMPLED = sampling_lib.SamplingConfig(temperature=1.0)
GAMMA, MAX_NEW = 3, 16


def _source(vocab, batch=3, length=7):
  rng = np.random.default_rng(0)
  ids = rng.integers(2, vocab, size=(batch, length))
  mask = (np.arange(length)[None] < np.array([7, 5, 2])[:, None]).astype(np.int32)
  return jnp.asarray(ids * mask, jnp.int32), jnp.asarray(mask)


def _speculative(pair, sampling, unroll_draft, **kw):
  target, drafter = pair
  ids, mask = _source(target.config.vocab_size)
  return decode.speculative_generate(
    target,
    drafter,
    ids,
    mask,
    gamma=GAMMA,
    sampling=sampling,
    max_new_tokens=MAX_NEW,
    rng=jax.random.key(7),
    unroll_draft=unroll_draft,
    **kw,
  )


def _same(a, b):
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.lengths, b.lengths)


def test_greedy_unrolled_equals_generate_and_the_scan(tiny_pair):
  target, _ = tiny_pair
  ids, mask = _source(target.config.vocab_size)
  ref = decode.generate(target, ids, mask, sampling=GREEDY, max_new_tokens=MAX_NEW, rng=None)
  assert float(ref.lengths.mean()) > 4  # not trivially short
  unrolled = _speculative(tiny_pair, GREEDY, True)
  scan = _speculative(tiny_pair, GREEDY, False)
  _same(unrolled, ref)
  _same(unrolled, scan)
  np.testing.assert_array_equal(unrolled.stats.accepted, scan.stats.accepted)
  with timing.compiles() as compiled:  # a second call compiles no loop
    _same(_speculative(tiny_pair, GREEDY, True), ref)
  assert not [name for name in compiled if 'speculative_loop' in name], compiled


def test_sampled_unrolled_draws_the_scans_tokens(tiny_pair):
  unrolled = _speculative(tiny_pair, SAMPLED, True)
  scan = _speculative(tiny_pair, SAMPLED, False)
  _same(unrolled, scan)
  np.testing.assert_array_equal(unrolled.stats.accepted, scan.stats.accepted)
  np.testing.assert_allclose(unrolled.stats.beta_sum, scan.stats.beta_sum, rtol=1e-6)
  # The key matters: another key draws other tokens (the comparison above is not vacuous).
  target, drafter = tiny_pair
  ids, mask = _source(target.config.vocab_size)
  other = decode.speculative_generate(
    target, drafter, ids, mask, gamma=GAMMA, sampling=SAMPLED, max_new_tokens=MAX_NEW,
    rng=jax.random.key(8), unroll_draft=True,
  )  # fmt: skip
  assert not np.array_equal(other.tokens, unrolled.tokens)


def _while_loops(pair, unroll_draft, **kw) -> int:
  """While loops in the lowered (StableHLO) program of `speculative_generate`."""
  target, drafter = pair
  ids, mask = _source(target.config.vocab_size)
  lowered = decode.lower_speculative(
    target, drafter, ids, mask, gamma=GAMMA, sampling=GREEDY, max_new_tokens=MAX_NEW,
    unroll_draft=unroll_draft, **kw,
  )  # fmt: skip
  return lowered.as_text().count('stablehlo.while')


@pytest.mark.parametrize('num_drafts', [1, 2])
def test_the_unrolled_program_has_no_while_loop_for_the_draft(tiny_pair, num_drafts):
  scan = _while_loops(tiny_pair, False, num_drafts=num_drafts)
  unrolled = _while_loops(tiny_pair, True, num_drafts=num_drafts)
  assert scan >= 2  # the decode loop and the draft's scan
  assert unrolled == scan - 1


def test_unroll_draft_must_be_a_bool(tiny_pair):
  with pytest.raises(TypeError, match='unroll_draft must be a bool'):
    _while_loops(tiny_pair, 'yes')
