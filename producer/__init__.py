"""Producer: datasets in, templated and counted prompts out, each enqueued once."""
