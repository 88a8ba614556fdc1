"""Tokenizer loading and incremental detokenisation."""
