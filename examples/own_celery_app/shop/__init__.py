"""A shop that already runs Celery, with the agent harness installed into its app.

cd examples/own_celery_app
celery -A shop worker -Q shop,agents    # the shop's queue and the agents' one
celery -A shop beat                     # the shop's own schedule, and the sweep
"""

from shop.celery import app

__all__ = ["app"]
