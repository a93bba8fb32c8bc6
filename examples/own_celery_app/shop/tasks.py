"""The shop's own tasks, which know nothing of the harness."""

from __future__ import annotations

from shop.celery import app


@app.task(name="shop.tasks.pack")
def pack(sku: str, quantity: int) -> str:
    """Pack a parcel."""
    return f"packed {quantity} x {sku}"


@app.task(name="shop.tasks.restock")
def restock() -> str:
    """The shop's periodic job, on its own beat schedule."""
    return "restocked"
