r"""Assembles pretrained/ende from trained runs: the pair, tokenizer, bigram, test pairs, card.

  python -m scripts.ship_pretrained --target=workdir/target/best --drafter=workdir/drafter/best \
      --data_dir=data/ende --output=pretrained/ende

Writes <output>/{target,drafter} (checkpoints.save directories), spm.model, bigram.npz (fitted on
the train targets), test.tsv (the first --num_test pairs of the test split) and MODEL_CARD.md
with each model's size, training steps, valid loss and greedy test BLEU on the shipped pairs.
"""

import json
import os
import shutil

from absl import app, flags

from specdec_jax import checkpoints, drafters, training
from specdec_jax.data import batching, pairs
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5

_TARGET = flags.DEFINE_string('target', 'workdir/target/best', 'Trained target (export dir).')
_DRAFTER = flags.DEFINE_string('drafter', 'workdir/drafter/best', 'Trained drafter.')
_DATA_DIR = flags.DEFINE_string('data_dir', 'data/ende', 'Output of scripts/build_ende.py.')
_OUTPUT = flags.DEFINE_string('output', 'pretrained/ende', 'Directory to (re)write.')
_NUM_TEST = flags.DEFINE_integer('num_test', 500, 'Test pairs shipped (and scored).')


def _describe(name: str, export_dir: str, model, test, tok) -> dict:
  with open(os.path.join(export_dir, 'best.json')) as f:
    best = json.load(f)
  data, _ = batching.encode_pairs(test, tok, max_source_length=64, max_target_length=64)
  kept = [p for p in test if len(tok.encode(p[0])) <= 64 and len(tok.encode(p[1])) <= 64]
  bleu, _ = training.evaluate_bleu(
    model, data, [t for _, t in kept], tok, batch_size=64, max_new_tokens=64
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
  out = _OUTPUT.value
  tok_path = os.path.join(_DATA_DIR.value, 'spm_ende_8k.model')
  tok = tokenizer_lib.Tokenizer.load(tok_path)
  test = pairs.load_pairs(os.path.join(_DATA_DIR.value, 'test.tsv'))[: _NUM_TEST.value]
  shutil.rmtree(out, ignore_errors=True)
  os.makedirs(out)
  rows = []
  for name, src in (('target', _TARGET.value), ('drafter', _DRAFTER.value)):
    model = checkpoints.restore(src)
    checkpoints.save(model, os.path.join(out, name))
    rows.append(_describe(name, src, model, test, tok))
  shutil.copy(tok_path, os.path.join(out, 'spm.model'))
  pairs.write_tsv(test, os.path.join(out, 'test.tsv'))
  train = pairs.load_pairs(os.path.join(_DATA_DIR.value, 'train.tsv'))
  bigram = drafters.NGramDrafter.fit(
    [tok.encode(t) for _, t in train],
    vocab_size=tok.vocab_size,
    order=2,
    add_k=0.01,
    top_k=16,
    eos_id=tok.eos_id,
  )
  bigram.save(os.path.join(out, 'bigram.npz'))
  with open(os.path.join(out, 'MODEL_CARD.md'), 'w') as f:
    f.write(_card(rows, len(test), len(train)))
  print(open(os.path.join(out, 'MODEL_CARD.md')).read())


def _card(rows, num_test, num_train) -> str:
  target, drafter = rows
  lines = [
    '# pretrained/ende: a T5 EN->DE target and drafter, trained by scripts/train.py',
    '',
    'Trained from scratch on CPU (2 cores) on the EN->DE corpus of `scripts/build_ende.py`',
    f'({num_train:,} train pairs: LibreOffice help + UI strings, MPL-2.0; Ding dictionary',
    'sentences, GPL-2+; see specdec_jax/data/README.md), tokenizer `spm.model` (SentencePiece',
    'unigram, 8,000 pieces, T5 ids). Greedy BLEU (sacrebleu) on the shipped test pairs.',
    '',
    '| model | layout | params | train steps (batch 128) | valid NLL | valid BLEU | test BLEU |',
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
  lines += [
    '',
    f'The drafter has {target["params"] / drafter["params"]:.1f}x fewer parameters than the '
    'target.',
    '`bigram.npz`: a bigram drafter (previous decoder token; add-0.01 smoothing, 16',
    'continuations kept per context) fitted on the train targets.',
    '',
    f'`test.tsv`: the first {num_test} pairs of the test split (same sources and licenses as',
    'above: LibreOffice help/UI translations (c) The Document Foundation and contributors,',
    'MPL-2.0; Ding (c) Frank Richter, TU Chemnitz, GPL-2+).',
    '',
  ]
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main)
