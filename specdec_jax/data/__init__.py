"""Data: the EN->DE corpus (`ende`, `libreoffice`, `ding`), the debsumm summarization corpus
(`debsumm`, `debian_descriptions`: Debian package description -> synopsis), pair files (`pairs`),
`tokenizer`, `batching`.

See README.md in this directory for the sources, licenses and counts.
"""
