/**
 * Keel from TypeScript: `schema.d.ts` (generated from `keel serve`'s OpenAPI document by
 * `openapi-typescript`) types an `openapi-fetch` client; this module adds the loop a payment
 * caller must not write by hand:
 *
 * - the intent id is required and is sent as `Idempotency-Key`: a retry is the same intent;
 * - a transport error, a timeout or a 5xx is retried with the same key and the same body, a
 *   bounded number of times, with a doubling backoff (the server may have acted: only the same
 *   key can find out);
 * - a 202 whose outcome is unknown is polled (`GET /v1/intents/{key}`, after each
 *   `Retry-After`: the server reconciles it meanwhile) until it is final or the deadline passes
 *   (`StillPending`); any other 202 (awaiting an approval) is sent again the same way;
 * - a 409 `intent_payload_mismatch` is `PayloadMismatch`, never retried; every other refusal
 *   is `Refused` with Keel's code.
 */
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.d.ts";

type ChargeRequest = components["schemas"]["ChargeRequest"];
type RefundRequest = components["schemas"]["RefundRequest"];

/** What Keel answers about an intent (`keel show --json`'s document, or a submission's). */
export type Intent = Record<string, unknown> & { status?: string; source?: string; retry_after_s?: number };

const FINAL = new Set(["validated", "declined", "rejected", "cancelled"]);
const UNKNOWN = new Set(["outcome_unknown", "reconciling"]);

/** A refusal from Keel: its status, code, message and details. */
export class KeelError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: unknown,
  ) {
    super(`${status} ${code}: ${message}`);
  }
}

/** The intent id was already used with another body: nothing was done, never retried. */
export class PayloadMismatch extends KeelError {}

/** Keel refused the request (or the provider declined): retrying will not change it. */
export class Refused extends KeelError {}

/** The outcome was still not known at the deadline; ask again later with the same id. */
export class StillPending extends Error {
  constructor(readonly intent: Intent) {
    super(`still ${String(intent.status)} at the deadline`);
  }
}

/** Every try failed in transport or with a 5xx: retry later with the same intent id. */
export class Unreachable extends Error {}

export interface Options {
  tries?: number;
  backoffMs?: number;
  deadlineMs?: number;
  timeoutMs?: number;
}

type Answer = { response: Response; data?: unknown; error?: unknown };

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

/** A Keel server reached with one API key. */
export class Keel {
  private readonly client;
  private readonly tries: number;
  private readonly backoffMs: number;
  private readonly deadlineMs: number;
  private readonly timeoutMs: number;

  constructor(baseUrl: string, apiKey: string, options: Options = {}) {
    this.client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` } });
    this.tries = options.tries ?? 6;
    this.backoffMs = options.backoffMs ?? 200;
    this.deadlineMs = options.deadlineMs ?? 60_000;
    this.timeoutMs = options.timeoutMs ?? 10_000;
  }

  charge(intentId: string, body: ChargeRequest): Promise<Intent> {
    return this.untilFinal(() =>
      this.client.POST("/v1/charges", { params: { header: { "Idempotency-Key": intentId } }, body, ...this.signal() }),
    );
  }

  refund(intentId: string, body: RefundRequest): Promise<Intent> {
    return this.untilFinal(() =>
      this.client.POST("/v1/refunds", { params: { header: { "Idempotency-Key": intentId } }, body, ...this.signal() }),
    );
  }

  /** An intent's state and history; another tenant's is `Refused` 404. */
  async intent(key: string): Promise<Intent> {
    return answer(await this.sent(() => this.client.GET("/v1/intents/{key}", { params: { path: { key } }, ...this.signal() })));
  }

  /** An operator's approval, bound to the fingerprint reviewed (operator key). */
  async approve(key: string, fingerprint?: string): Promise<Intent> {
    return answer(
      await this.sent(() =>
        this.client.POST("/v1/intents/{key}/approve", { params: { path: { key } }, body: { fingerprint }, ...this.signal() }),
      ),
    );
  }

  private signal() {
    return { signal: AbortSignal.timeout(this.timeoutMs) };
  }

  /**
   * `send()` until the intent is final: a 202 whose outcome is unknown is read again
   * (`GET /v1/intents/{key}`: the server reconciles it), any other 202 (awaiting an approval,
   * reserved for its caller) is sent again, each after its `Retry-After`.
   */
  private async untilFinal(send: () => Promise<Answer>): Promise<Intent> {
    const deadline = Date.now() + this.deadlineMs;
    let sent = await this.sent(send);
    let read = false;
    for (;;) {
      const intent = answer(sent);
      const status = String(intent.status);
      if (FINAL.has(status) || (sent.response.status !== 202 && !read)) {
        return intent;
      }
      const wait = (intent.retry_after_s ?? 1) * 1000;
      if (Date.now() + wait > deadline) {
        throw new StillPending(intent);
      }
      await sleep(wait);
      read = UNKNOWN.has(status);
      if (read) {
        const key = String(intent.intent_key);
        sent = await this.sent(() => this.client.GET("/v1/intents/{key}", { params: { path: { key } }, ...this.signal() }));
      } else {
        sent = await this.sent(send);
      }
    }
  }

  /** `send()` until it gets an answer below 500, at most `tries` times. */
  private async sent(send: () => Promise<Answer>): Promise<Answer> {
    let pause = this.backoffMs;
    for (let attempt = 0; attempt < this.tries; attempt++) {
      try {
        const sent = await send();
        if (sent.response.status < 500) {
          return sent;
        }
      } catch {
        // A transport error or a timeout: the same request again, after a pause.
      }
      if (attempt + 1 < this.tries) {
        await sleep(pause);
        pause *= 2;
      }
    }
    throw new Unreachable(`no answer below 500 in ${this.tries} tries`);
  }
}

function answer(sent: Answer): Intent {
  if (sent.response.status < 300) {
    return (sent.data ?? {}) as Intent;
  }
  const error = ((sent.error ?? {}) as { error?: { code?: string; message?: string; details?: unknown } }).error ?? {};
  const Kind = error.code === "intent_payload_mismatch" ? PayloadMismatch : Refused;
  throw new Kind(sent.response.status, error.code ?? "", error.message ?? "", error.details);
}
