from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="ApproveRequest")


@_attrs_define
class ApproveRequest:
    """`POST /v1/intents/{key}/approve`.

    Attributes:
        fingerprint (None | str | Unset): The fingerprint reviewed; refused if it is not the intent's.
        ttl_ms (int | None | Unset): How long the approval stays valid, ms (default one hour, at most 30 days).
    """

    fingerprint: None | str | Unset = UNSET
    ttl_ms: int | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        fingerprint: None | str | Unset
        if isinstance(self.fingerprint, Unset):
            fingerprint = UNSET
        else:
            fingerprint = self.fingerprint

        ttl_ms: int | None | Unset
        if isinstance(self.ttl_ms, Unset):
            ttl_ms = UNSET
        else:
            ttl_ms = self.ttl_ms

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if fingerprint is not UNSET:
            field_dict["fingerprint"] = fingerprint
        if ttl_ms is not UNSET:
            field_dict["ttl_ms"] = ttl_ms

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_fingerprint(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        fingerprint = _parse_fingerprint(d.pop("fingerprint", UNSET))

        def _parse_ttl_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        ttl_ms = _parse_ttl_ms(d.pop("ttl_ms", UNSET))

        approve_request = cls(
            fingerprint=fingerprint,
            ttl_ms=ttl_ms,
        )

        return approve_request
