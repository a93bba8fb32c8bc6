"""The shop's own tasks, which know nothing of the harness."""

from __future__ import annotations

from dataclasses import dataclass

from shop.celery import app


@dataclass(frozen=True)
class Parcel:
    """A Python object as a task argument: it needs the pickle serializer."""

    sku: str
    quantity: int


@app.task(name="shop.tasks.pack")
def pack(parcel: Parcel) -> str:
    """Pack a parcel."""
    return f"packed {parcel.quantity} x {parcel.sku}"


@app.task(name="shop.tasks.restock")
def restock() -> str:
    """The shop's periodic job, on its own beat schedule."""
    return "restocked"
