"""Where the time of a jitted decode loop goes, from XLA:CPU's per-op trace.

The decode loops tag their work with `jax.named_scope` ('drafter', 'target', 'sampling',
'verify', 'emit', and 'encode' for the per-call encoder and cache setup); each compiled op carries its scope in its `op_name` metadata. With XLA:CPU's
per-thunk trace events turned on (`XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true`, set before
JAX starts), `jax.profiler.trace` records every op's duration; `breakdown` sums them by scope.
Time in no op at all (the executor walking the while loop, dispatch) is the loop's own cost.

  breakdown = profiling.breakdown(jitted, [(args, kwargs), ...], runs=3)
  breakdown.shares()   # {'drafter': 0.12, 'target': 0.61, ..., 'loop': 0.08}
"""

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile

import jax

from specdec_jax.measure import timing

TRACE_FLAG = '--xla_cpu_enable_xprof_traceme=true'
# Innermost scope wins: sampling inside the drafter's scan counts as sampling.
COMPONENTS = ('sampling', 'verify', 'emit', 'drafter', 'target', 'encode')
_CONTAINERS = ('while', 'conditional', 'call')


def tracing_enabled() -> bool:
  return TRACE_FLAG in os.environ.get('XLA_FLAGS', '')


def enable_tracing() -> None:
  """Turns on per-op trace events; must run before JAX initializes its CPU backend."""
  if not tracing_enabled():
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + TRACE_FLAG).strip()


@dataclasses.dataclass
class Breakdown:
  """Seconds per call of a jitted function, by component; 'loop' is wall time in no op."""

  seconds: dict[str, float]
  wall: float

  def shares(self, exclude: tuple[str, ...] = ()) -> dict[str, float]:
    """Each component's fraction of the time, leaving out `exclude` (e.g. the per-call 'encode')."""
    kept = {k: v for k, v in self.seconds.items() if k not in exclude}
    total = sum(kept.values()) or 1.0
    return {k: v / total for k, v in kept.items()}


def _op_scopes(hlo_text: str) -> dict[str, str]:
  """{instruction name: component} from a compiled module's text; containers map to ''.

  Ops that XLA creates while compiling (e.g. the gemv a 1-row dot becomes) carry no `op_name`:
  they take the component of their first operand that has one.
  """
  line_re = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (?:\(.*?\)|\S+) ([\w-]+)\((.*)')
  own, operands, opcodes, calls = {}, {}, {}, {}
  dots_in = collections.defaultdict(list)  # computation -> components of its dots
  computation = None
  for line in hlo_text.splitlines():
    header = re.match(r'^%?([\w.\-]+) .*\{$', line)
    if header and not line.startswith(' '):
      computation = header.group(1)
    m = line_re.match(line)
    if not m:
      continue
    name, opcode, rest = m.groups()
    opcodes[name] = opcode
    operands[name] = re.findall(r'%([\w.\-]+)', rest.split(')', 1)[0])
    called = re.search(r'calls=%([\w.\-]+)', rest)
    calls[name] = called.group(1) if called else None
    op_name = re.search(r'op_name="([^"]*)"', rest)
    parts = op_name.group(1).split('/') if op_name else []
    own[name] = next((c for c in COMPONENTS if c in parts), 'loop' if op_name else None)
    if opcode in ('dot', 'convolution') and own[name] not in (None, 'loop'):
      dots_in[computation].append(own[name])
  # A fusion that contains a matmul is that matmul's work (XLA:CPU fuses e.g. the target's
  # logits matmul with the softmax that follows it).
  for name, called in calls.items():
    if opcodes[name] in ('fusion', 'custom-call') and dots_in.get(called):
      own[name] = dots_in[called][0]
  for _ in range(8):  # inherit along operand chains (bitcasts, copies) of unlabeled ops
    for name, component in own.items():
      if component is None:
        own[name] = next((own[o] for o in operands[name] if own.get(o) not in (None, 'loop')), None)
  return {name: '' if opcodes[name] in _CONTAINERS else (c or 'loop') for name, c in own.items()}


def _union_length(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, -float('inf')
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def breakdown(jitted, calls, *, runs: int = 3) -> Breakdown:
  """Profiles `runs` passes over `calls` and splits the time of one pass by component.

  XLA:CPU runs independent ops concurrently on its worker threads, so op durations are not
  added up: the time some op of the module is running (the union of their intervals) is shared
  among components in proportion to their op time, and the rest of the module's execution, when
  no op runs, is the loop's own overhead ('loop').

  Args:
    jitted: a `jax.jit`-wrapped function.
    calls: [(args, kwargs)] of one compiled shape (e.g. the batches of a test set).
    runs: passes traced.
  """
  if not tracing_enabled():
    raise RuntimeError(
      f'Per-op tracing is off: start Python with XLA_FLAGS={TRACE_FLAG} (or '
      'call profiling.enable_tracing() before JAX initializes).'
    )
  args, kwargs = calls[0]
  text = jitted.lower(*args, **kwargs).compile().as_text()
  scopes = _op_scopes(text)
  module = text.split('HloModule ', 1)[1].split(',', 1)[0].split(' ', 1)[0]
  run_all = lambda: [jax.block_until_ready(jitted(*a, **k)) for a, k in calls]
  run_all()
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir, create_perfetto_trace=True):
      wall = timing.timed(lambda: [run_all() for _ in range(runs)], 'profiled runs')[1] / runs
    path = sorted(glob.glob(os.path.join(logdir, '**', '*.trace.json.gz'), recursive=True))[-1]
    with gzip.open(path) as f:
      events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  op_time = collections.Counter()
  intervals, executed = [], 0.0
  for e in events:
    if e.get('ph') != 'X':
      continue
    a = e.get('args') or {}
    if a.get('hlo_module') == module:
      component = scopes.get(a.get('hlo_op'), 'loop')
      if component:
        op_time[component] += e['dur']
        intervals.append((e['ts'], e['ts'] + e['dur']))
    elif e.get('name') == 'ThunkExecutor::Execute (wait for completion)':
      executed += e['dur']
  busy = _union_length(intervals)
  total_ops = sum(op_time.values()) or 1.0
  seconds = {c: busy * op_time.get(c, 0.0) / total_ops * 1e-6 / runs for c in COMPONENTS}
  executed = executed * 1e-6 / runs or wall
  seconds['loop'] = busy * op_time.get('loop', 0.0) / total_ops * 1e-6 / runs + max(
    executed - busy * 1e-6 / runs, 0.0
  )
  return Breakdown(seconds, executed)
