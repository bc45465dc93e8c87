"""The hook that hands jobs which became terminal to the node's webhooks."""

from __future__ import annotations

from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Outcome
from goqueue.supervisor.webhooks.delivery import Webhooks


class WebhookHook(Hook):
    """Tells the node's webhooks about jobs that became terminal (done, failed or
    cancelled): delivery, and whether its record is durable, is their business."""

    needs = "webhook_url"  # most jobs have none: they cost this hook no call

    def __init__(self, webhooks: Webhooks) -> None:
        self.webhooks = webhooks

    def after_outcome(self, outcome: Outcome) -> None:
        self.webhooks.notify(outcome.job)

    def after_cancel(self, job: Job, force: bool) -> None:
        self.webhooks.notify(job)
