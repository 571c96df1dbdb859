"""Keel's Python client against a real `keel serve`, driven by tests/it/clients.rs.

    python scenarios.py basic   # charge, re-submission, mismatch, refund over the charge,
                                # another tenant's key, an operator's approval
    python scenarios.py crash   # one charge whose server dies mid-flight and comes back
    python scenarios.py lost    # one charge whose provider answer is lost: 202, then reconciled

The server's address and keys come from KEEL_URL, KEEL_SUBMIT, KEEL_OPERATOR, KEEL_STRANGER;
TENANT is the keys' tenant. Each scenario asserts what it promises and prints one JSON line
of what the Rust side checks against the log and the provider (the intent keys it made).
"""

import json
import os
import sys

from keel import Keel, PayloadMismatch, Refused, StillPending

URL = os.environ["KEEL_URL"]
TENANT = os.environ["KEEL_TENANT"]
CARD = "pm_card_visa"


def key(kind, intent_id):
    return f"{kind}:{TENANT}:{intent_id}"


def basic():
    keel = Keel(URL, os.environ["KEEL_SUBMIT"])
    first = keel.charge("py_order_1_charge", order_id="py_order_1", amount_minor=4900, currency="EUR",
                        payment_method_token=CARD)
    assert (first["status"], first["source"]) == ("validated", "provider"), first
    again = keel.charge("py_order_1_charge", order_id="py_order_1", amount_minor=4900, currency="EUR",
                        payment_method_token=CARD)
    assert (again["status"], again["source"]) == ("validated", "deduplicated"), again
    assert again["provider_ref"] == first["provider_ref"], again
    events = len(keel.intent(key("charge", "py_order_1_charge"))["events"])
    try:
        keel.charge("py_order_1_charge", order_id="py_order_1", amount_minor=9900, currency="EUR",
                    payment_method_token=CARD)
        raise AssertionError("a mismatch must raise")
    except PayloadMismatch as mismatch:
        assert mismatch.status == 409, mismatch
    assert len(keel.intent(key("charge", "py_order_1_charge"))["events"]) == events, "the mismatch wrote nothing"
    try:
        keel.refund("py_order_1_refund_1", order_id="py_order_1", amount_minor=5000, currency="EUR")
        raise AssertionError("a refund over the charge must be refused")
    except Refused as refused:
        assert refused.code == "invariant_violated", refused
    stranger = Keel(URL, os.environ["KEEL_STRANGER"])
    try:
        stranger.intent(key("charge", "py_order_1_charge"))
        raise AssertionError("another tenant's key must not see the intent")
    except Refused as hidden:
        assert (hidden.status, hidden.code) == (404, "not_found"), hidden
    # Above the server's approval threshold: the charge waits for a human, who approves it.
    waiting = Keel(URL, os.environ["KEEL_SUBMIT"], deadline_s=0)
    try:
        waiting.charge("py_order_2_charge", order_id="py_order_2", amount_minor=25000, currency="EUR",
                       payment_method_token=CARD)
        raise AssertionError("the charge must wait for approval")
    except StillPending as pending:  # the deadline of 0 s passed at once
        assert pending.document["status"] == "awaiting_approval", pending.document
    fingerprint = keel.intent(key("charge", "py_order_2_charge"))["intent"]["fingerprint"]
    operator = Keel(URL, os.environ["KEEL_OPERATOR"])
    approved = operator.approve(key("charge", "py_order_2_charge"), fingerprint)
    assert approved["approval"]["by"] == "ops", approved
    # Approved, the same request goes through.
    charged = keel.charge("py_order_2_charge", order_id="py_order_2", amount_minor=25000, currency="EUR",
                          payment_method_token=CARD)
    assert (charged["status"], charged["source"]) == ("validated", "provider"), charged
    print(json.dumps({"charged": [key("charge", "py_order_1_charge"), key("charge", "py_order_2_charge")]}))


def crash():
    keel = Keel(URL, os.environ["KEEL_SUBMIT"], tries=10, backoff_s=0.25)
    charged = keel.charge("py_crash_charge", order_id="py_crash", amount_minor=1500, currency="EUR",
                          payment_method_token=CARD)
    assert charged["status"] == "validated", charged
    print(json.dumps({"charged": [key("charge", "py_crash_charge")], "source": charged["source"]}))


def lost():
    keel = Keel(URL, os.environ["KEEL_SUBMIT"], deadline_s=60)
    charged = keel.charge("py_lost_charge", order_id="py_lost", amount_minor=2500, currency="EUR",
                          payment_method_token=CARD)
    assert (charged["status"], charged["source"]) == ("validated", "reconciled"), charged
    print(json.dumps({"charged": [key("charge", "py_lost_charge")], "source": charged["source"]}))


if __name__ == "__main__":
    {"basic": basic, "crash": crash, "lost": lost}[sys.argv[1]]()
