"""The example actors a fresh node runs: `email`, `webhook` and `report`."""

from goqueue.actors.examples.email import send_email
from goqueue.actors.examples.report import build_report
from goqueue.actors.examples.webhook import call_webhook

__all__ = ["build_report", "call_webhook", "send_email"]
