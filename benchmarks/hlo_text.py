"""Optimized HLO text (`compiled.as_text()`), read: the benchmarks' one reader of it.

  comps, entry = hlo_text.computations(text)        # {computation: its instruction lines}, the entry
  name, shape, opcode, rest = hlo_text.instruction(line).groups()
  hlo_text.called(opcode, rest)                     # the computations an instruction runs
  hlo_text.launches(text)                           # what a device launches: a Counter by kind

What XLA:TPU estimates an op costs (`tpu_costs`) and what XLA:GPU launches a call
(`launches`, `drafter_kernels`, `tree_pass_tpu`) are both read from these lines. Instruction names carry a '%' in some
printers and not in others; both are read.
"""

import collections
import re

# `%name = type opcode(operands), attributes`; the type may be a tuple with /*index=N*/ comments.
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$')
_COMPUTATION = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+) .*\{$')
# Computations an op runs as ops of their own (not those it fuses or reduces with), a while's
# body first, then its condition.
_RUNS = tuple(
  re.compile(rf'\b{key}=%?([\w.\-]+)')
  for key in ('body', 'condition', 'true_computation', 'false_computation')
)
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')


def instruction(line: str) -> re.Match | None:
  """The match of an instruction line: groups (name, result type, opcode, the rest after the
  opcode's '('), or None for anything else."""
  return _INSTRUCTION.match(line)


def computations(text: str) -> tuple[dict[str, list[str]], str | None]:
  """Optimized HLO text -> ({computation name: its instruction lines}, the entry's name, None
  where the text has no ENTRY)."""
  comps, entry, name = {}, None, None
  for line in text.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      name = match.group(2)
      comps[name] = []
      entry = name if match.group(1) else entry
    elif line.strip() == '}':
      name = None
    elif name is not None and line.strip():
      comps[name].append(line)
  return comps, entry


def called(opcode: str, rest: str) -> list[str]:
  """The computations an instruction runs as ops of their own: a while's body then its
  condition, a conditional's branches, a call's callee (not what a fusion fuses, nor a reduce's
  reducer). `rest`: the instruction's text after its opcode's '('."""
  runs = [m.group(1) for m in (pattern.search(rest) for pattern in _RUNS) if m]
  for branches in _BRANCHES.findall(rest):
    runs += [b.strip().lstrip('%') for b in branches.split(',')]
  if opcode == 'call':
    runs += re.findall(r'to_apply=%?([\w.\-]+)', rest)
  return runs


def while_loops(text: str, computation: str | None = None) -> list[tuple[str, str]]:
  """(body, condition) of each while loop `computation` (None: the entry) runs, in order."""
  comps, entry = computations(text)
  loops = []
  for line in comps[computation or entry]:
    match = instruction(line)
    if match and match.group(3) == 'while':
      body, condition = called('while', match.group(4))[:2]
      loops.append((body, condition))
  return loops


# Instructions that launch nothing.
FREE = frozenset(
  ['parameter', 'constant', 'tuple', 'get-tuple-element', 'bitcast', 'after-all', 'opt-barrier']
)


def category(opcode: str, rest: str) -> str:
  """What an instruction launches: 'gemm', 'copy', 'fusion', 'while', 'custom-call' or 'other'.
  `rest`: the instruction's text after its opcode's '('."""
  # What it runs (the called computation, a custom call's target), not its operands' names: an
  # operand named gemm_fusion_dot.3 does not make a reduction a GEMM.
  runs = ' '.join(re.findall(r'(?:calls=%?|custom_call_target="|"kind":")([\w.$\-]+)', rest))
  if opcode in ('dot', 'convolution'):
    return 'gemm'
  if opcode in ('fusion', 'custom-call') and re.search(r'gemm|cublas|matmul|ynn', runs, re.I):
    return 'gemm'
  if opcode in ('copy', 'transpose') or opcode == 'fusion' and re.search(r'transpose|copy', runs):
    return 'copy'
  return opcode if opcode in ('fusion', 'while', 'custom-call') else 'other'


def launches(text: str, computation: str | None = None) -> collections.Counter:
  """What `computation` (default: the entry) of an optimized HLO module launches: a Counter of
  'fusion', 'gemm', 'copy', 'while', 'custom-call', 'other' and their 'total', the computations
  it runs counted in (a while loop's body and condition once each, every branch, calls)."""
  comps, entry = computations(text)
  counts = collections.Counter()

  def visit(name):
    for line in comps[name]:
      match = instruction(line)
      if not match or match.group(3) in FREE:
        continue
      _, _, opcode, rest = match.groups()
      counts[category(opcode, rest)] += 1
      counts['total'] += 1
      for sub in called(opcode, rest):
        visit(sub)

  visit(computation or entry)
  return counts
