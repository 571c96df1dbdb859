/**
 * Keel's TypeScript client against a real `keel serve`, driven by tests/it/clients.rs.
 *
 *   tsx test/scenarios.ts basic   # charge, re-submission, mismatch, refund over the charge,
 *                                 # another tenant's key, an operator's approval
 *   tsx test/scenarios.ts crash   # one charge whose server dies mid-flight and comes back
 *   tsx test/scenarios.ts lost    # one charge whose provider answer is lost: 202, then reconciled
 *
 * The server's address and keys come from KEEL_URL, KEEL_SUBMIT, KEEL_OPERATOR, KEEL_STRANGER,
 * the keys' tenant from KEEL_TENANT. Each scenario asserts what it promises and prints one JSON
 * line with the intent keys it made, which the Rust side checks against the provider.
 */
import assert from "node:assert/strict";
import { Keel, PayloadMismatch, Refused, StillPending } from "../src/keel.ts";

const env = (name: string): string => {
  const value = process.env[name];
  assert.ok(value, `${name} is set`);
  return value;
};
const URL = env("KEEL_URL");
const TENANT = env("KEEL_TENANT");
const CARD = "pm_card_visa";
const key = (kind: string, intentId: string) => `${kind}:${TENANT}:${intentId}`;

async function refusedWith<E extends Error>(kind: new (...args: never[]) => E, work: () => Promise<unknown>): Promise<E> {
  let caught: unknown;
  try {
    await work();
  } catch (error) {
    caught = error;
  }
  if (!(caught instanceof kind)) {
    throw new assert.AssertionError({ message: `expected ${kind.name}, got ${String(caught)}` });
  }
  return caught;
}

async function basic() {
  const keel = new Keel(URL, env("KEEL_SUBMIT"));
  const charge = { order_id: "ts_order_1", amount_minor: 4900, currency: "EUR", payment_method_token: CARD };
  const first = await keel.charge("ts_order_1_charge", charge);
  assert.deepEqual([first.status, first.source], ["validated", "provider"]);
  const again = await keel.charge("ts_order_1_charge", charge);
  assert.deepEqual([again.status, again.source], ["validated", "deduplicated"]);
  assert.equal(again.provider_ref, first.provider_ref);
  const events = ((await keel.intent(key("charge", "ts_order_1_charge"))).events as unknown[]).length;
  const mismatch = await refusedWith(PayloadMismatch, () => keel.charge("ts_order_1_charge", { ...charge, amount_minor: 9900 }));
  assert.equal(mismatch.status, 409);
  assert.equal(((await keel.intent(key("charge", "ts_order_1_charge"))).events as unknown[]).length, events, "the mismatch wrote nothing");
  const over = await refusedWith(Refused, () =>
    keel.refund("ts_order_1_refund_1", { order_id: "ts_order_1", amount_minor: 5000, currency: "EUR" }),
  );
  assert.equal(over.code, "invariant_violated");
  const stranger = new Keel(URL, env("KEEL_STRANGER"));
  const hidden = await refusedWith(Refused, () => stranger.intent(key("charge", "ts_order_1_charge")));
  assert.deepEqual([hidden.status, hidden.code], [404, "not_found"]);
  // Above the server's approval threshold: the charge waits for a human, who approves it.
  const big = { order_id: "ts_order_2", amount_minor: 25000, currency: "EUR", payment_method_token: CARD };
  const waiting = await refusedWith(StillPending, () => new Keel(URL, env("KEEL_SUBMIT"), { deadlineMs: 0 }).charge("ts_order_2_charge", big));
  assert.equal(waiting.intent.status, "awaiting_approval");
  const shown = await keel.intent(key("charge", "ts_order_2_charge"));
  const fingerprint = (shown.intent as { fingerprint: string }).fingerprint;
  const approved = await new Keel(URL, env("KEEL_OPERATOR")).approve(key("charge", "ts_order_2_charge"), fingerprint);
  assert.equal((approved.approval as { by: string }).by, "ops");
  // Approved, the same request goes through.
  const charged = await keel.charge("ts_order_2_charge", big);
  assert.deepEqual([charged.status, charged.source], ["validated", "provider"]);
  console.log(JSON.stringify({ charged: [key("charge", "ts_order_1_charge"), key("charge", "ts_order_2_charge")] }));
}

async function crash() {
  const keel = new Keel(URL, env("KEEL_SUBMIT"), { tries: 10, backoffMs: 250 });
  const charged = await keel.charge("ts_crash_charge", { order_id: "ts_crash", amount_minor: 1500, currency: "EUR", payment_method_token: CARD });
  assert.equal(charged.status, "validated");
  console.log(JSON.stringify({ charged: [key("charge", "ts_crash_charge")], source: charged.source }));
}

async function lost() {
  const keel = new Keel(URL, env("KEEL_SUBMIT"));
  const charged = await keel.charge("ts_lost_charge", { order_id: "ts_lost", amount_minor: 2500, currency: "EUR", payment_method_token: CARD });
  assert.deepEqual([charged.status, charged.source], ["validated", "reconciled"]);
  console.log(JSON.stringify({ charged: [key("charge", "ts_lost_charge")], source: charged.source }));
}

const scenarios: Record<string, () => Promise<void>> = { basic, crash, lost };
const chosen = scenarios[process.argv[2] ?? ""];
assert.ok(chosen, `a scenario: ${Object.keys(scenarios).join(", ")}`);
await chosen();
