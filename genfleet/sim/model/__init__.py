"""The simulator's test model: its tokenizer and chat template, as package data (`build_model` writes them)."""
