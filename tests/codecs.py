"""An ``ARGUMENT_CODEC`` for the tests: money as a type of the project's own."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any


@dataclasses.dataclass(frozen=True)
class Money:
    amount: Decimal
    currency: str


class MoneyCodec:
    def encode(self, value: Any) -> tuple[str, Any] | None:
        if isinstance(value, Money):
            return "money", {"amount": str(value.amount), "currency": value.currency}
        return None

    def decode(self, tag: str, value: Any) -> Any:
        if tag != "money":
            raise ValueError(f"no type is tagged {tag!r}")
        return Money(Decimal(value["amount"]), value["currency"])


codec = MoneyCodec()
