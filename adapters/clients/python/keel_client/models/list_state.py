from enum import StrEnum


class ListState(StrEnum):
    ATTEMPTING = "attempting"
    AWAITING_APPROVAL = "awaiting_approval"
    CANCELLED = "cancelled"
    DECLINED = "declined"
    ESCALATED = "escalated"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILING = "reconciling"
    REJECTED = "rejected"
    RESERVED = "reserved"
    VALIDATED = "validated"
    VALUE_0 = ""

    def __str__(self) -> str:
        return str(self.value)
