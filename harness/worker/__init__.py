"""Worker-side plumbing: the Celery configuration and sender (celeryconf), beat's
in-process sweeper, the brokers' transports, worker processes and their health."""
