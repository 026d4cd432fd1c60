r"""Assembles a pair directory under pretrained/ from trained runs: the target, an optional
independently trained drafter, the tokenizer, a bigram drafter, the test pairs, pair.json and a
model card.

  python -m scripts.ship_pretrained --target=workdir/target/best --drafter=workdir/drafter/best \
      --data_dir=data/ende --output=pretrained/ende
  python -m scripts.ship_pretrained --task=ende --target=workdir/target_grown/best --drafter= \
      --train_batch_size=64 --storage_dtype=bfloat16 --grown_from=pretrained/ende/target \
      --output=pretrained/ende48m
  python -m scripts.ship_pretrained --task=debsumm --target=workdir/summ_ende/best --drafter= \
      --tokenizer=pretrained/ende/spm.model --finetuned_from=pretrained/ende/target \
      --train_batch_size=64 --storage_dtype=bfloat16 --output=pretrained/debsumm

Writes <output>/{target,drafter} (checkpoints.save directories; --storage_dtype=bfloat16 halves
them, and every number on the card is then measured on the stored, bfloat16-rounded weights;
--storage_dtype=int8-delta --delta_base=DIR stores a fine-tuned target as an int8 delta from the
shipped DIR, a drafter as bfloat16),
spm.model, bigram.npz (fitted on the train targets), test.tsv (the first --num_test pairs of the
test split), pair.json (drafters 'small-t5' and 'bigram'; `scripts/add_drafter.py` adds more) and
MODEL_CARD.md with each model's size, training steps, valid loss and greedy test BLEU.
"""

import json
import os
import shutil

from absl import app, flags

from specdec_jax import checkpoints, drafters
from specdec_jax.data import batching, pairs
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5
from specdec_jax.training import trainer

# Per task: data directory, tokenizer file in it, max source / target tokens, and the corpus
# paragraph of the model card.
TASKS = {
  'ende': dict(
    data_dir='data/ende',
    tokenizer='spm_ende_8k.model',
    lengths=(64, 64),
    title='a T5 EN->DE target and drafter',
    corpus='the EN->DE corpus of `scripts/build_ende.py` ({num_train:,} train pairs: LibreOffice '
    'help + UI strings, MPL-2.0; Ding dictionary sentences, GPL-2+; see '
    'specdec_jax/data/README.md)',
    test_license='LibreOffice help/UI translations (c) The Document Foundation and '
    'contributors, MPL-2.0; Ding (c) Frank Richter, TU Chemnitz, GPL-2+',
  ),
  'debsumm': dict(
    data_dir='data/debsumm',
    tokenizer='spm_debsumm_8k.model',
    lengths=(256, 40),
    title='a T5 summarizer (Debian package description -> synopsis) and drafter',
    corpus='the debsumm corpus of `scripts/build_summ.py` ({num_train:,} train pairs: the '
    'extended description of a Debian package -> its one-line synopsis, split by source '
    'package; see specdec_jax/data/README.md)',
    test_license="Debian package descriptions, each under its package's license (see the "
    "package's copyright file)",
  ),
}

_TASK = flags.DEFINE_enum('task', 'ende', list(TASKS), 'Which corpus the pair was trained on.')
_TARGET = flags.DEFINE_string('target', 'workdir/target/best', 'Trained target (export dir).')
_DRAFTER = flags.DEFINE_string('drafter', 'workdir/drafter/best', "Trained drafter ('': none).")
_DATA_DIR = flags.DEFINE_string('data_dir', None, "Default: the task's (e.g. data/ende).")
_OUTPUT = flags.DEFINE_string('output', 'pretrained/ende', 'Directory to (re)write.')
_NUM_TEST = flags.DEFINE_integer('num_test', 500, 'Test pairs shipped (and scored).')
_STORAGE = flags.DEFINE_enum(
  'storage_dtype', None, ['bfloat16', 'int8-delta'], 'Store float32 weights as (checkpoints.save).'
)
_DELTA_BITS = flags.DEFINE_integer('delta_bits', 8, '--storage_dtype=int8-delta: bits per weight.')
_DELTA_BASE = flags.DEFINE_string(
  'delta_base',
  None,
  "--storage_dtype=int8-delta: the shipped checkpoint the target's delta is from.",
)
_BATCH = flags.DEFINE_integer('train_batch_size', 128, 'Batch size the runs trained with.')
_TOKENIZER = flags.DEFINE_string(
  'tokenizer', '', "SentencePiece model the pair uses. Default: the task's, in --data_dir."
)
_FINETUNED_FROM = flags.DEFINE_string(
  'finetuned_from', '', 'The target started as this trained model (training config init_from).'
)
_GROWN_FROM = flags.DEFINE_string(
  'grown_from', '', 'The target started as this smaller one grown (training config init_from).'
)


def _describe(name: str, export_dir: str, model, test, tok, lengths) -> dict:
  with open(os.path.join(export_dir, 'best.json')) as f:
    best = json.load(f)
  max_source, max_target = lengths
  data, _ = batching.encode_pairs(
    test, tok, max_source_length=max_source, max_target_length=max_target
  )
  kept = [
    p for p in test if len(tok.encode(p[0])) <= max_source and len(tok.encode(p[1])) <= max_target
  ]
  bleu, _ = trainer.evaluate_bleu(
    model, data, [t for _, t in kept], tok, batch_size=64, max_new_tokens=max_target
  )
  return {
    'name': name,
    'params': t5.param_count(model.params),
    'config': model.config,
    'step': best['step'],
    'valid_nll': best['valid_nll'],
    'valid_bleu': best['valid_bleu'],
    'test_bleu': bleu,
    'test_pairs': len(kept),
  }


def main(argv):
  del argv
  task, out = TASKS[_TASK.value], _OUTPUT.value
  data_dir = _DATA_DIR.value or task['data_dir']
  tok_path = _TOKENIZER.value or os.path.join(data_dir, task['tokenizer'])
  tok = tokenizer_lib.Tokenizer.load(tok_path)
  test = pairs.load_pairs(os.path.join(data_dir, 'test.tsv'))[: _NUM_TEST.value]
  shutil.rmtree(out, ignore_errors=True)
  os.makedirs(out)
  rows = []
  models = [('target', _TARGET.value)] + ([('drafter', _DRAFTER.value)] if _DRAFTER.value else [])
  for name, src in models:
    delta = _STORAGE.value == 'int8-delta'
    checkpoints.save(
      checkpoints.restore(src),
      os.path.join(out, name),
      storage_dtype=_STORAGE.value if name == 'target' or not delta else 'bfloat16',
      delta_base=_DELTA_BASE.value if name == 'target' and delta else None,
      delta_bits=_DELTA_BITS.value,
    )
    model = checkpoints.restore(os.path.join(out, name))  # what is shipped: scored as stored
    rows.append(_describe(name, src, model, test, tok, task['lengths']))
  shutil.copy(tok_path, os.path.join(out, 'spm.model'))
  pairs.write_tsv(test, os.path.join(out, 'test.tsv'))
  train = pairs.load_pairs(os.path.join(data_dir, 'train.tsv'))
  bigram = drafters.NGramDrafter.fit(
    [tok.encode(t) for _, t in train],
    vocab_size=tok.vocab_size,
    order=2,
    add_k=0.01,
    top_k=16,
    eos_id=tok.eos_id,
  )
  bigram.save(os.path.join(out, 'bigram.npz'))
  drafter_dirs = {'small-t5': 'drafter'} if _DRAFTER.value else {}
  manifest = {
    'target': 'target',
    'drafters': {**drafter_dirs, 'bigram': 'bigram.npz'},
    'recommended': 'small-t5' if _DRAFTER.value else 'bigram',
    'gamma': {'0': 4, '1': 4},
  }
  with open(os.path.join(out, 'pair.json'), 'w') as f:
    json.dump(manifest, f, indent=2)
    f.write('\n')
  with open(os.path.join(out, 'MODEL_CARD.md'), 'w') as f:
    f.write(_card(out, task, rows, len(test), len(train)))
  print(open(os.path.join(out, 'MODEL_CARD.md')).read())


def _origin() -> str:
  if _GROWN_FROM.value:
    return (
      f'The target is `{_GROWN_FROM.value}` grown to its shape with the same function '
      '(specdec_jax/models/t5_growth.py), then trained on; trained on CPU'
    )
  if _FINETUNED_FROM.value:
    return f'The target is `{_FINETUNED_FROM.value}` fine-tuned (same shape and tokenizer) on CPU'
  return 'Trained from scratch on CPU'


def _card(out: str, task: dict, rows, num_test: int, num_train: int) -> str:
  stored = {
    None: '',
    'bfloat16': ' (stored as bfloat16; BLEU of the stored weights)',
    'int8-delta': f' (the target stored as a {_DELTA_BITS.value}-bit delta from '
    f'`{_DELTA_BASE.value}`, the drafter as bfloat16; BLEU of the stored weights)',
  }[_STORAGE.value]
  lines = [
    f'# {out}: {task["title"]}, trained by scripts/train.py',
    '',
    _origin() + f' on {task["corpus"].format(num_train=num_train)}, tokenizer '
    '`spm.model` (SentencePiece unigram, T5 ids). Greedy BLEU (sacrebleu) on the shipped test '
    f'pairs{stored}.',
    '',
    f'| model | layout | params | train steps (batch {_BATCH.value}) | valid NLL | valid BLEU '
    '| test BLEU |',
    '|---|---|---:|---:|---:|---:|---:|',
  ]
  for r in rows:
    c = r['config']
    layout = (
      f'{c.feed_forward}, {"tied" if c.tie_word_embeddings else "untied"}, '
      f'd_model {c.d_model}, {c.num_heads}x{c.d_kv} heads, d_ff {c.d_ff}, '
      f'{c.num_encoder_layers}+{c.num_decoder_layers} layers'
    )
    lines.append(
      f'| {r["name"]} | {layout} | {r["params"]:,} | {r["step"]:,} | '
      f'{r["valid_nll"]:.3f} | {r["valid_bleu"]:.1f} | {r["test_bleu"]:.1f} |'
    )
  lines.append('')
  if len(rows) == 2:
    ratio = rows[0]['params'] / rows[1]['params']
    lines.append(f'The drafter has {ratio:.1f}x fewer parameters than the target.')
  lines += [
    '`bigram.npz`: a bigram drafter (previous decoder token; add-0.01 smoothing, 16',
    'continuations kept per context) fitted on the train targets.',
    '',
    f'`test.tsv`: the first {num_test} pairs of the test split ({task["test_license"]}).',
    '',
  ]
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main)
