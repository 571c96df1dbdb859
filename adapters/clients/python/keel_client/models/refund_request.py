from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="RefundRequest")


@_attrs_define
class RefundRequest:
    """`POST /v1/refunds`: the CLI's refund contract, identity as for a charge.

    Attributes:
        amount_minor (int): Amount in integer minor units.
        currency (str): The charge's currency.
        order_id (str): The charged order.
        intent_id (None | str | Unset): The `Idempotency-Key`, if repeated.
        tenant_id (None | str | Unset): The key's tenant, if repeated.
    """

    amount_minor: int
    currency: str
    order_id: str
    intent_id: None | str | Unset = UNSET
    tenant_id: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        amount_minor = self.amount_minor

        currency = self.currency

        order_id = self.order_id

        intent_id: None | str | Unset
        if isinstance(self.intent_id, Unset):
            intent_id = UNSET
        else:
            intent_id = self.intent_id

        tenant_id: None | str | Unset
        if isinstance(self.tenant_id, Unset):
            tenant_id = UNSET
        else:
            tenant_id = self.tenant_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "amount_minor": amount_minor,
                "currency": currency,
                "order_id": order_id,
            }
        )
        if intent_id is not UNSET:
            field_dict["intent_id"] = intent_id
        if tenant_id is not UNSET:
            field_dict["tenant_id"] = tenant_id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        amount_minor = d.pop("amount_minor")

        currency = d.pop("currency")

        order_id = d.pop("order_id")

        def _parse_intent_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        intent_id = _parse_intent_id(d.pop("intent_id", UNSET))

        def _parse_tenant_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        tenant_id = _parse_tenant_id(d.pop("tenant_id", UNSET))

        refund_request = cls(
            amount_minor=amount_minor,
            currency=currency,
            order_id=order_id,
            intent_id=intent_id,
            tenant_id=tenant_id,
        )

        return refund_request
