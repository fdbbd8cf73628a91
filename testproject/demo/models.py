from django.db import models


class Execution(models.Model):
    """One row per handler execution, written in the handler's own transaction."""

    label = models.CharField(max_length=100)
    job_id = models.BigIntegerField(null=True)
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.label} (job {self.job_id}, pid {self.pid})"


class Payment(models.Model):
    """A payment recorded by an atomic handler (docs/atomic-handlers.md)."""

    order_id = models.BigIntegerField()
    amount_cents = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.amount_cents} cents for order {self.order_id}"
