"""Text to tokens and back on the router: prompts, chat templates, the synthetic word tokenizer."""
