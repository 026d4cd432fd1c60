"""Tests of reading decode outputs: `decode.to_host` and `check_finite` on sharded outputs.

One process here; the 2-process test (arrays spanning processes) calls the same helpers.
"""

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode, decode_stats
from specdec_jax import sampling as sampling_lib
from tests import fakes, helpers


def test_to_host_returns_numpy_leaves_of_the_same_values():
  target = fakes.random_markov(seed=1)
  ids, mask = jnp.zeros((3, 1), jnp.int32), jnp.ones((3, 1), jnp.int32)
  out = decode.speculative_generate(
    target,
    fakes.random_markov(seed=2),
    ids,
    mask,
    gamma=2,
    sampling=sampling_lib.SamplingConfig(temperature=1.0),
    max_new_tokens=5,
    rng=jax.random.key(0),
    trace=True,
  )
  host = decode.to_host(out)
  assert isinstance(host, decode.DecodeOutput)
  leaves, want = jax.tree.leaves(host), jax.tree.leaves(out)
  assert len(leaves) == len(want) == 2 + 9 + 4  # tokens, lengths, stats and trace
  for got, expected in zip(leaves, want):
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, expected)
  assert not decode_stats.spans_processes(out.tokens)  # one process: every array is addressable


# A (data=2, model=4) mesh of 8 CPU devices: an output whose rows are split over 'data'. `to_host`
# reads it both ways: np.asarray (addressable here) and, forced, the gather a multi-host run takes
# (process_allgather of a global array); `check_finite` raises on an output over the 8 devices
# through the same gather.
_SHARDED_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from specdec_jax import decode, decode_stats, sharding
from specdec_jax.sampling import SamplingConfig
from tests import fakes

assert jax.device_count() == 8, jax.devices()
mesh = sharding.make_mesh(data=2, model=4)
rows = NamedSharding(mesh, P('data', None))
target, drafter = fakes.random_markov(seed=1), fakes.random_markov(seed=2)
ids = jnp.zeros((8, 1), jnp.int32)
kw = dict(gamma=2, sampling=SamplingConfig(temperature=1.0), max_new_tokens=6,
          rng=jax.random.key(0))
want = decode.speculative_generate(target, drafter, ids, ids + 1, **kw)
replicate = lambda m: fakes.MarkovModel(m.steps, jax.device_put(m.params, NamedSharding(mesh, P())))
target, drafter = replicate(target), replicate(drafter)
sharded_ids = jax.device_put(ids, rows)
with jax.set_mesh(mesh):
  got = decode.speculative_generate(target, drafter, sharded_ids, sharded_ids + 1, **kw)
# Every array with its rows split over 'data' (whatever sharding the loop chose).
by_rows = lambda x: NamedSharding(mesh, P('data', *[None] * (x.ndim - 1)))
got = jax.tree.map(lambda x: jax.device_put(x, by_rows(x)), got)
read = decode.to_host(got)
decode_stats.spans_processes = lambda x: isinstance(x, jax.Array)  # force the gather path
gathered_rows = []  # per array to_host gathers: the rows of each shard it was given
allgather = multihost_utils.process_allgather
def counted_allgather(x, **kw):
  gathered_rows.append(sorted(s.index[0].start for s in x.addressable_shards))
  return allgather(x, **kw)
multihost_utils.process_allgather = counted_allgather
gathered = decode.to_host(got)
multihost_utils.process_allgather = allgather
# The gather ran, once per array, on arrays whose halves of the rows lie on different devices.
assert len(gathered_rows) == len(jax.tree.leaves(got)), gathered_rows
assert all(starts == [0] * 4 + [4] * 4 for starts in gathered_rows), gathered_rows
for host in (read, gathered):
  for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(want), strict=True):
    assert type(a) is np.ndarray
    np.testing.assert_array_equal(a, np.asarray(b))
table = np.array(target.params['table'])
table[0] = np.nan
bad = fakes.MarkovModel(target.steps, {'table': jnp.asarray(table)})
try:
  with jax.set_mesh(mesh):
    out = decode.speculative_generate(bad, drafter, sharded_ids, sharded_ids + 1, **kw)
  raise AssertionError('no NonFiniteError')
except decode.NonFiniteError as e:
  assert 'NaN or inf in 8 row(s)' in str(e), e
print('OUTPUT_SHARDED_OK')
"""


def test_to_host_and_check_finite_on_a_sharded_output():
  helpers.run_on_cpu_devices(_SHARDED_SCRIPT, 'OUTPUT_SHARDED_OK')
