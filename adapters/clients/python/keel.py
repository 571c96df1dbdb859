"""Keel from Python: the generated client (`keel_client`) with what every caller needs.

The generated package speaks each route of Keel's OpenAPI document. This module adds the
loop a payment caller must not write by hand:

- the intent id is required and is sent as `Idempotency-Key`: a retry is the same intent;
- a transport error, a timeout or a 5xx is retried with the same key and the same body,
  a bounded number of times, with a doubling backoff (the server may have acted: only the
  same key can find out);
- a 202 whose outcome is unknown is polled (`GET /v1/intents/{key}`, after each
  `Retry-After`: the server reconciles it meanwhile) until it is final or the deadline passes
  (`StillPending`); any other 202 (awaiting an approval) is sent again the same way;
- a 409 `intent_payload_mismatch` (the key was used with another body) is `PayloadMismatch`,
  never retried; every other refusal is `Refused` with Keel's code.

    keel = Keel("http://127.0.0.1:8080", api_key)
    charge = keel.charge("order_1842_charge", order_id="order_1842", amount_minor=4900,
                         currency="EUR", payment_method_token="pm_card_visa")
    assert charge["status"] == "validated"
    keel.refund("order_1842_refund_1", order_id="order_1842", amount_minor=1000, currency="EUR")
"""

import json
import time

import httpx

from keel_client import AuthenticatedClient
from keel_client.api.effects import charge as charge_route
from keel_client.api.effects import refund as refund_route
from keel_client.api.intents import show as show_route
from keel_client.api.operators import approve as approve_route
from keel_client.models import ApproveRequest, ChargeRequest, RefundRequest
from keel_client.types import UNSET

FINAL = {"validated", "declined", "rejected", "cancelled"}
UNKNOWN = {"outcome_unknown", "reconciling"}


class KeelError(Exception):
    """A refusal from Keel: its code, its message, its details."""

    def __init__(self, status, code, message, details):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


class PayloadMismatch(KeelError):
    """The intent id was already used with another body: nothing was done, never retried."""


class Refused(KeelError):
    """Keel refused the request (or the provider declined): it will not change by retrying."""


class StillPending(Exception):
    """The outcome was still not known when the deadline passed; ask again later, same key."""

    def __init__(self, document):
        super().__init__(f"still {document.get('status')} at the deadline")
        self.document = document


class Unreachable(Exception):
    """Every try failed in transport or with a 5xx; the effect may have happened: retry later
    with the same intent id, never another."""


class Keel:
    """A Keel server reached with one API key."""

    def __init__(self, base_url, api_key, *, tries=6, backoff_s=0.2, deadline_s=60.0, timeout_s=10.0):
        self._client = AuthenticatedClient(
            base_url=base_url, token=api_key, timeout=httpx.Timeout(timeout_s), raise_on_unexpected_status=False
        )
        self._tries, self._backoff_s, self._deadline_s = tries, backoff_s, deadline_s

    def charge(self, intent_id, *, order_id, amount_minor, currency, payment_method_token):
        body = ChargeRequest(
            order_id=order_id,
            amount_minor=amount_minor,
            currency=currency,
            payment_method_token=payment_method_token,
        )
        return self._until_final(lambda: charge_route.sync_detailed(client=self._client, body=body, idempotency_key=intent_id))

    def refund(self, intent_id, *, order_id, amount_minor, currency):
        body = RefundRequest(order_id=order_id, amount_minor=amount_minor, currency=currency)
        return self._until_final(lambda: refund_route.sync_detailed(client=self._client, body=body, idempotency_key=intent_id))

    def intent(self, key):
        """An intent's state and history (`keel show`); another tenant's is `Refused` 404."""
        return self._answer(self._sent(lambda: show_route.sync_detailed(key, client=self._client)))

    def approve(self, key, fingerprint=None):
        """An operator's approval, bound to the fingerprint reviewed (operator key)."""
        body = ApproveRequest(fingerprint=fingerprint if fingerprint is not None else UNSET)
        return self._answer(self._sent(lambda: approve_route.sync_detailed(key, client=self._client, body=body)))

    def _until_final(self, send):
        """`send()` until the intent is final: a 202 whose outcome is unknown is read again
        (`GET /v1/intents/{key}`: the server reconciles it), any other 202 (awaiting an
        approval, reserved for its caller) is sent again, each after its `Retry-After`."""
        deadline = time.monotonic() + self._deadline_s
        response, read = self._sent(send), False
        while True:
            document = self._answer(response)
            status = document.get("status")
            if status in FINAL or (response.status_code != 202 and not read):
                return document
            wait = float(document.get("retry_after_s") or 1)
            if time.monotonic() + wait > deadline:
                raise StillPending(document)
            time.sleep(wait)
            read = status in UNKNOWN
            if read:
                key = document["intent_key"]
                response = self._sent(lambda: show_route.sync_detailed(key, client=self._client))
            else:
                response = self._sent(send)

    def _sent(self, send):
        """`send()` until it gets an answer below 500, at most `tries` times."""
        pause = self._backoff_s
        for attempt in range(self._tries):
            try:
                response = send()
                if response.status_code < 500:
                    return response
            except httpx.TransportError:
                pass
            if attempt + 1 < self._tries:
                time.sleep(pause)
                pause *= 2
        raise Unreachable(f"no answer below 500 in {self._tries} tries")

    @staticmethod
    def _answer(response):
        document = json.loads(response.content) if response.content else {}
        if response.status_code < 300:
            return document
        error = document.get("error", {})
        kind = PayloadMismatch if error.get("code") == "intent_payload_mismatch" else Refused
        raise kind(response.status_code, error.get("code"), error.get("message"), error.get("details"))
