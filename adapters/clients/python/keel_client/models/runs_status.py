from enum import StrEnum


class RunsStatus(StrEnum):
    ANSWER_TOO_LARGE = "answer_too_large"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    COST_BUDGET = "cost_budget"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DECLINED = "declined"
    DELEGATION_BUDGET = "delegation_budget"
    ESCALATED = "escalated"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    MODEL_BUDGET = "model_budget"
    NONDETERMINISTIC_REPLAY = "nondeterministic_replay"
    NO_PROGRESS = "no_progress"
    OUTCOME_UNKNOWN = "outcome_unknown"
    PERMISSION_DENIED = "permission_denied"
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    REJECTED = "rejected"
    REPEATED_CALL = "repeated_call"
    RUNNING = "running"
    SCHEMA_BUDGET = "schema_budget"
    TOKEN_BUDGET = "token_budget"
    TOOL_BUDGET = "tool_budget"
    TRUNCATED = "truncated"
    VALUE_0 = ""

    def __str__(self) -> str:
        return str(self.value)
