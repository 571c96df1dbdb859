"""Contains all the data models used in inputs/outputs"""

from .approve_request import ApproveRequest
from .charge_request import ChargeRequest
from .empty_request import EmptyRequest
from .error_body import ErrorBody
from .error_fields import ErrorFields
from .list_state import ListState
from .metrics_by import MetricsBy
from .reason_request import ReasonRequest
from .refund_request import RefundRequest
from .resolve_request import ResolveRequest
from .runs_status import RunsStatus

__all__ = (
    "ApproveRequest",
    "ChargeRequest",
    "EmptyRequest",
    "ErrorBody",
    "ErrorFields",
    "ListState",
    "MetricsBy",
    "ReasonRequest",
    "RefundRequest",
    "ResolveRequest",
    "RunsStatus",
)
