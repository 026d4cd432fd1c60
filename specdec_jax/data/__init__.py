"""EN->DE data: corpus building (`ende`, `libreoffice`, `ding`), pair files (`pairs`), `tokenizer`.

See README.md in this directory for the sources, licenses and counts.
"""
