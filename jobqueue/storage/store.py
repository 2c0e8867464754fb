"""The queue's operations, written once: enqueue, acquire, flush outcomes, heartbeat, release.

Every outcome is fenced: it is applied only to a message still PROCESSING under the lease token of
the delivery that produced it (``Dialect.lock_held``), so a worker that lost its lease can never
complete, retry or archive a message someone else now holds. Transactions are short; none is held
while a job runs.

The operations are grouped by what they are for, a module each: enqueueing (store_enqueue),
acquiring (store_acquire), what follows a delivery (store_deliveries) and the supervisors' upkeep
(store_maintenance), all on the transactions, errors and lease clock of store_base.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from jobqueue.storage.store_acquire import AcquireOperations
from jobqueue.storage.store_deliveries import DeliveryOperations
from jobqueue.storage.store_enqueue import EnqueueOperations
from jobqueue.storage.store_maintenance import MaintenanceOperations
from jobqueue.storage.tables import Tables


class Store(EnqueueOperations, AcquireOperations, DeliveryOperations, MaintenanceOperations):
    """The queue's operations on one database, through its dialect (which runs them its own way)."""


@contextmanager
def schema_errors(engine: sa.Engine, tables: Tables) -> Iterator[None]:
    """For code with an engine of its own (Spark executors): missing tables as a SchemaError."""
    with Store(engine, tables).schema_errors():
        yield
