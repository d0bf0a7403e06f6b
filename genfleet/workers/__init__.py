"""Workers: the Celery app, the generate task, the SGLang client, upstream routing, shard writing."""
