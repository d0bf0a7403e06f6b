"""genfleet: run large prompt datasets through SGLang servers as a Celery fleet."""
