"""`benchmarks.drafter_kernels`: what a compiled program launches, counted from its HLO (issue 34).

The counter's parts are checked on small programs whose launches are known, and the decoder
layer's dots on the lowered (backend-independent) step.
"""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import drafter_kernels, hlo_text, synthetic
from specdec_jax.models import t5


def _loop(x, w, unroll=1):
  body = lambda i, x: jnp.tanh(x @ w) + 1.0
  return jax.lax.fori_loop(0, 3, body, x * 2.0, unroll=unroll).sum()


def test_launches_count_a_loops_body_condition_and_the_ops_around_it():
  x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
  hlo = jax.jit(_loop).lower(x, w).compile().as_text()
  ((body, condition),) = hlo_text.while_loops(hlo)
  total = hlo_text.launches(hlo)
  in_body, in_condition = (hlo_text.launches(hlo, c) for c in (body, condition))
  assert total['while'] == 1 and in_body['while'] == 0
  assert in_body['gemm'] == total['gemm'] == 1  # the dot is in the body, counted once
  assert in_condition['total'] >= 1
  # The loop itself, the ops before and after it (x * 2, the sum), its body and condition.
  assert total['total'] >= 1 + 2 + in_body['total'] + in_condition['total']
  unrolled = jax.jit(lambda x, w: _loop(x, w, unroll=True)).lower(x, w).compile().as_text()
  counts = hlo_text.launches(unrolled)
  assert counts['while'] == 0 and counts['gemm'] == 3
  assert hlo_text.while_loops(unrolled) == []


def test_launches_skip_what_launches_nothing():
  reshape = jax.jit(lambda x: x.reshape(2, 8), donate_argnums=0)  # a parameter and a bitcast
  assert hlo_text.launches(reshape.lower(jnp.ones(16)).compile().as_text())['total'] == 0
  fused = jax.jit(lambda x: (jnp.sin(x) + 1.0).reshape(2, 8), donate_argnums=0)
  counts = hlo_text.launches(fused.lower(jnp.ones(16)).compile().as_text())
  assert counts['fusion'] == 1 and counts['total'] == 1 + counts['copy']  # XLA:CPU copies out


def test_gemms_name_what_each_reads_and_its_bytes():
  params = {'w1': jnp.ones((64, 256)), 'w2': jnp.ones((256, 32))}
  program = jax.jit(lambda p, x: jnp.tanh(x @ p['w1']) @ p['w2'])
  found = drafter_kernels.gemms(program.lower(params, jnp.ones((2, 64))).compile().as_text())
  # Two GEMMs (the tanh is not one), each reading its weight and its input, writing its output;
  # the first reads two of the program's arguments.
  assert [g['inputs'] for g in found] == [['x.1', 'p__w1__.1'], ['p__w2__.1']]
  assert [g['bytes'] for g in found] == [
    4 * (2 * 64 + 64 * 256 + 2 * 256),
    4 * (2 * 256 + 256 * 32 + 2 * 32),
  ]
  table = drafter_kernels.gemm_table(found)
  assert [(r['inputs'], r['launches']) for r in table] == [('x + w1', 1), ('w2', 1)]
  # A launch's kind is what it runs, not its operands' names (a reduction of a GEMM's output).
  category = hlo_text.category
  assert category('fusion', '%gemm_fusion_dot.3), kind=kInput, calls=%fused_reduce.1') == 'fusion'
  assert category('fusion', '%a, %w), kind=kCustom, calls=%gemm_fusion_dot.3_computation') == 'gemm'


def test_stablehlo_ops_count_a_called_function_once_per_call():
  inner = jax.jit(lambda x: jnp.sin(x) * 2.0)
  text = jax.jit(lambda x: inner(inner(x)) + 1.0).lower(jnp.ones(3)).as_text()
  assert drafter_kernels.stablehlo_ops(text, 'sine') == 2
  assert drafter_kernels.stablehlo_ops(text) == 2 * 3 + 2  # sine, broadcast, multiply; + 1.0


def test_the_draft_loops_launches_count_its_scan_once_an_iteration(xla_cpu_defaults):
  config = t5.CONFIGS['tiny-v1.0']
  gamma = 3
  counts = drafter_kernels.count(config, source_length=8, cache_len=16, gamma=gamma)
  scan, unrolled, step = (counts[k] for k in ('draft loop (scan)', 'draft loop (unrolled)', 'step'))
  assert scan['launches']['while'] == 1 and 'while' not in unrolled['launches']
  # gamma - 1 iterations of the body: gamma - 2 more than the HLO holds, and a condition more.
  assert scan['per_call'] > scan['launches']['total'] + (gamma - 2) * scan['loop_body']
  assert scan['per_step'] == scan['per_call'] / gamma
  assert unrolled['per_call'] == unrolled['launches']['total']
  assert step['per_call'] == step['per_step'] == step['launches']['total']
  assert step['per_layer'] == step['per_step'] / config.num_decoder_layers


@pytest.mark.parametrize(('name', 'mlp_dots'), [('tiny-v1.0', 2), ('tiny-v1.1', 3)])
def test_a_decoder_layer_asks_for_its_queries_keys_and_values_in_three_dots(name, mlp_dots):
  # Per layer: self-attention 6 dots (queries, keys, values, scores, values, output),
  # encoder-decoder attention 4 (its keys and values are in the cache), the MLP 2 (ReLU) or 3
  # (gated GELU); and the output layer. Three projection dots, not one over their kernels stacked:
  # XLA:GPU merges them itself where they are GEMMs, while a stacked kernel is a copy of the three
  # inside the decode loop for a large target (issue 34; docs/performance.md).
  config = t5.CONFIGS[name]
  model = synthetic.abstract_model(config)
  params = model.params
  cache = synthetic.abstract_cache(model, batch=1, source_length=8, cache_len=16)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  step = jax.jit(lambda p, t, c: t5.decode(p, t, c, config=config))
  text = step.lower(params, tokens, cache).as_text()
  dots = drafter_kernels.stablehlo_ops(text, 'dot_general')
  assert dots == (10 + mlp_dots) * config.num_decoder_layers + 1


def test_an_iteration_is_counted_with_its_draft_scan_and_unrolled():
  # `iteration` finds the decode loop by the draft scan it holds, or, unrolled
  # (`lower_speculative(..., unroll_draft=True)`), as the one loop, holding none; else it raises.
  target, drafter = t5.CONFIGS['tiny-v1.1'], t5.CONFIGS['tiny-v1.0']
  kw = dict(source_length=8, gamma=3)
  scan = drafter_kernels.iteration(target, drafter, **kw)
  unrolled = drafter_kernels.iteration(target, drafter, unroll_draft=True, **kw)
  for counts in (scan, unrolled):
    assert counts['weight_copies'] == 0
  # What docs/performance.md reports for an H100 (1,351 -> 1,277 launches) holds on XLA:CPU at
  # these shapes: unrolled, an iteration launches fewer kernels (no inner loop to test).
  assert 0 < unrolled['per_iteration'] < scan['per_iteration']


def test_a_block_drafter_is_one_call_with_no_loop_and_so_is_its_iteration(xla_cpu_defaults):
  # `--model=block --target=...`: its gamma drafts in one call (no scan, nothing to unroll), and
  # the decode loop holding that call and no loop; it needs a target to draft over.
  target = t5.CONFIGS['tiny-v1.1']
  drafter = drafter_kernels.drafter_shape('block:tiny-v1.1', 'tiny-v1.1', 'float32')
  assert drafter.block_size and drafter.feature_dim == target.d_model
  counts = drafter_kernels.count(drafter, source_length=8, cache_len=16, gamma=3)
  assert list(counts) == ['block call']
  call = counts['block call']
  assert 'while' not in call['launches'] and call['per_call'] == call['launches']['total'] > 0
  iteration = drafter_kernels.iteration(target, drafter, source_length=8, gamma=3)
  assert iteration['per_iteration'] > call['per_call'] and iteration['weight_copies'] == 0
  with pytest.raises(drafter_kernels.app.UsageError, match='pass --target'):
    drafter_kernels.drafter_shape('block', None, 'float32')
