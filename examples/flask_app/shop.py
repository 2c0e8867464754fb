"""A small Flask shop: an order and the job that confirms it are written in one transaction.

Placing an order inserts the order row and enqueues ``confirm_order`` through ``db.session``. If the
payment is declined the request rolls back, and the job goes with the order: no worker ever sees
it. See README.md in this folder for how to run it.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Mapped, mapped_column

from jobqueue import JobQueue

db = SQLAlchemy()
jq = JobQueue()


class Order(db.Model):  # type: ignore[name-defined,misc]
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(db.String(100))
    quantity: Mapped[int]
    status: Mapped[str] = mapped_column(db.String(20), default="placed")
    confirmation: Mapped[str | None] = mapped_column(db.String(40))


class PaymentDeclined(Exception):
    pass


@jq.task(name="shop.confirm_order")
def confirm_order(order_id: int) -> str:
    """Runs in a worker process, inside an app context: db.session works as it does in a view."""
    order = db.session.get(Order, order_id)
    if order is None:
        raise LookupError(f"order {order_id} does not exist")
    order.status = "confirmed"
    order.confirmation = f"CONF-{order_id:06d}"
    db.session.commit()
    return order.confirmation


def charge(order: Order) -> None:
    if order.quantity > 100:
        raise PaymentDeclined(f"{order.quantity} x {order.item} is over the card's limit")


def create_app(database_url: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = (
        database_url or os.environ.get("SHOP_DATABASE_URL") or "sqlite:///shop.sqlite3"
    )
    db.init_app(app)
    jq.init_app(app, db)  # jobs go through db.session; `flask jobqueue ...` runs the jobqueue CLI

    @app.post("/orders")
    def place_order() -> Any:
        data = request.get_json(force=True)
        order = Order(item=str(data["item"]), quantity=int(data["quantity"]))
        db.session.add(order)
        db.session.flush()  # gives the order its id
        job = confirm_order.delay(order.id)  # written in the same transaction as the order
        charge(order)  # may raise PaymentDeclined: then neither the order nor its job exist
        db.session.commit()
        return jsonify(id=order.id, job=job.id), 201

    @app.get("/orders/<int:order_id>")
    def show_order(order_id: int) -> Any:
        order = db.get_or_404(Order, order_id)
        return jsonify(
            id=order.id, item=order.item, quantity=order.quantity, status=order.status, confirmation=order.confirmation
        )

    @app.errorhandler(PaymentDeclined)
    def declined(error: PaymentDeclined) -> Any:
        db.session.rollback()
        return jsonify(error=str(error)), 402

    @app.cli.command("init-db")
    def init_db() -> None:
        """Create the shop's tables and jobqueue's."""
        db.create_all()
        print(jq.init_schema())

    return app
