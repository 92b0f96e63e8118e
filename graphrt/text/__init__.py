"""Text in and out: a checkpoint's tokenizer and chat template, and replies decoded as they stream."""

from graphrt.text.tokenizer import NoTokenizer, Tokenizer, chat_prompt, load_tokenizer

__all__ = ["NoTokenizer", "Tokenizer", "chat_prompt", "load_tokenizer"]
