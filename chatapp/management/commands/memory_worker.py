"""``manage.py memory_worker``: a job worker of the durable queue (``MEMORY_JOB_QUEUE=procrastinate``, docs/deploy.md).
Runs memory jobs, and every few seconds sends the jobs of a worker that stopped beating (killed, its machine gone)
back to the queue, so that another worker finishes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run memory jobs from the durable queue (MEMORY_JOB_QUEUE=procrastinate on PostgreSQL)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--concurrency", type=int, default=2, help="jobs run at once (default 2)")
        parser.add_argument(
            "--stalled-after",
            type=float,
            default=10.0,
            help="seconds without a heartbeat after which a worker's jobs are sent back to the queue (default 10)",
        )

    def handle(self, *args: Any, concurrency: int, stalled_after: float, **options: Any) -> None:
        if settings.MEMORY_JOB_QUEUE != "procrastinate":
            raise CommandError("memory_worker runs the durable queue: set MEMORY_JOB_QUEUE=procrastinate (PostgreSQL).")
        if concurrency < 1 or stalled_after < 2:
            raise CommandError("--concurrency must be at least 1 and --stalled-after at least 2 seconds.")
        from procrastinate.contrib.django import app

        # Django's connector cannot LISTEN: the worker gets a connection pool of its own to the same database.
        with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
            asyncio.run(self.run(app, concurrency=concurrency, stalled_after=stalled_after))

    async def run(self, app: Any, *, concurrency: int, stalled_after: float) -> None:
        from procrastinate.worker import Worker

        from chatapp.chats.job_queue import QUEUE

        async with app.open_async():
            worker = Worker(
                app=app,
                queues=[QUEUE],
                concurrency=concurrency,
                fetch_job_polling_interval=0.5,
                update_heartbeat_interval=stalled_after / 4,
                stalled_worker_timeout=stalled_after,
                delete_jobs="successful",
            )
            side = [
                asyncio.create_task(self.heartbeat_keep(app, worker, stalled_after)),
                asyncio.create_task(self.stalled_jobs_retry(app, stalled_after)),
            ]
            try:
                self.stdout.write(f"memory worker: queue {QUEUE!r}, {concurrency} at once", ending="\n")
                self.stdout.flush()
                await worker.run()
            finally:
                for task in side:
                    task.cancel()
                for task in side:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def heartbeat_keep(self, app: Any, worker: Any, stalled_after: float) -> None:
        """Beat for this worker until it is unregistered: Procrastinate stops beating when a graceful stop begins,
        while the jobs still run, and other workers would then take them for a killed worker's."""
        while True:
            await asyncio.sleep(stalled_after / 4)
            if worker.worker_id is not None:
                try:
                    await app.job_manager.update_heartbeat(worker.worker_id)
                except Exception:
                    logger.exception("could not record this memory worker's heartbeat")

    async def stalled_jobs_retry(self, app: Any, stalled_after: float) -> None:
        """Every quarter of ``stalled_after``, send the running jobs of workers silent that long back to the queue
        (never this process's own); a job whose conversation has a newer job waiting already is done by that one."""
        from procrastinate.exceptions import UniqueViolation
        from procrastinate.jobs import Status

        from chatapp.chats.job_queue import running_here

        while True:
            await asyncio.sleep(stalled_after / 4)
            try:
                for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after):
                    if job.id in running_here:
                        continue
                    try:
                        await app.job_manager.retry_job(job)
                    except UniqueViolation:
                        await app.job_manager.finish_job(job, status=Status.SUCCEEDED, delete_job=True)
                        logger.warning(
                            "memory job %s (%s) of a stopped worker is left to the newer job queued for it",
                            job.id,
                            job.lock,
                        )
                    else:
                        logger.warning(
                            "memory job %s (%s) of a stopped worker goes back to the queue", job.id, job.lock
                        )
            except Exception:
                logger.exception("could not look for the jobs of stopped workers")
