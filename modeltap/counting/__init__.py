"""Counting: the served model's chat template and tokenizer, without I/O or aiohttp. TokenCounter
(counter.py) counts a request's prompt exactly, rendering only what new messages add (windows.py,
conversations.py, segments.py) and encoding with tiktoken where it is proven exact (bpe.py), else the
tokenizers library; ids.py renders token ids where an engine returns none. The only importer of
jinja2, tiktoken and tokenizers (the `[budget]` extra)."""
