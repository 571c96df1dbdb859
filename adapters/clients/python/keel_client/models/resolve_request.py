from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="ResolveRequest")


@_attrs_define
class ResolveRequest:
    """`POST /v1/intents/{key}/resolve`: exactly one of `landed` and `absent: true`.

    Attributes:
        reason (str): Why (recorded).
        absent (bool | Unset): The operator asserts the effect did not happen.
        landed (None | str | Unset): The provider's reference proving the effect landed.
        override (None | str | Unset): Record it although the provider's lookup contradicts it, for this reason.
    """

    reason: str
    absent: bool | Unset = UNSET
    landed: None | str | Unset = UNSET
    override: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        reason = self.reason

        absent = self.absent

        landed: None | str | Unset
        if isinstance(self.landed, Unset):
            landed = UNSET
        else:
            landed = self.landed

        override: None | str | Unset
        if isinstance(self.override, Unset):
            override = UNSET
        else:
            override = self.override

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "reason": reason,
            }
        )
        if absent is not UNSET:
            field_dict["absent"] = absent
        if landed is not UNSET:
            field_dict["landed"] = landed
        if override is not UNSET:
            field_dict["override"] = override

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        reason = d.pop("reason")

        absent = d.pop("absent", UNSET)

        def _parse_landed(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        landed = _parse_landed(d.pop("landed", UNSET))

        def _parse_override(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        override = _parse_override(d.pop("override", UNSET))

        resolve_request = cls(
            reason=reason,
            absent=absent,
            landed=landed,
            override=override,
        )

        return resolve_request
