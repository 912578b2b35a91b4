"""rose_ensemble: the text side of the `embed` ensemble (prompt templating and tokenization).

It needs only `tokenizers` and numpy, so it runs in cheap CPU instances beside the engine and
changes to prompts or tokenizer settings never touch the inference instances.
"""
