// The TypeScript client against a live Fenceline (tests/clients/test_typescript_client.py
// serves one and runs `npm test` with these variables): FENCELINE_URL, FENCELINE_TOKEN and
// FENCELINE_TOKEN_2 (two workers of one tenant whose policy puts the tool "payments" before a
// person), and FENCELINE_ERROR_CODES (every error code the server has, as JSON). The test's approver approves every pending payment of the resource
// "customer:approve-me" and leaves the others waiting.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import {
  Client,
  ERRORS,
  FencelineError,
  IdempotencyMismatch,
  InvalidRequest,
  LeaseHeld,
  LeaseLost,
  NotFound,
  RetryLater,
  StaleToken,
  TransportError,
  Unauthorized,
  errorFor,
  newTraceparent,
} from "../src/index.js";

function required(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is set by the test that serves Fenceline`);
  return value;
}

const url = required("FENCELINE_URL");
const worker = new Client(url, { token: required("FENCELINE_TOKEN") });
const other = new Client(url, { token: required("FENCELINE_TOKEN_2") });
const key = (what: string) => `${what}:${randomUUID()}`;

/** Block this process's event loop, as a long GC pause or a stopped process would: no timer fires. */
function pause(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

async function until(condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 100 && !condition(); i++) await new Promise((resolve) => setTimeout(resolve, 100));
  assert.ok(condition(), what);
}

test("a run is created, leased, renewed in the background and walked to CONFIRMED", async () => {
  const runId = await worker.createRun({ externalId: key("ts-walk") });
  const done = await worker.withLease(runId, { ttlS: 1 }, async (lease) => {
    assert.equal(lease.fencingToken, 1);
    assert.equal(lease.checkpointState, null);
    const walked = await lease.operation({
      tool: "email",
      action: "send",
      resource: "mailto:ops@example.com",
      effectClass: "IDEMPOTENT",
      idempotencyKey: key("mail"),
      perform: async () => ({ providerRequestId: "msg-1" }),
    });
    await lease.checkpoint("sent", { n: 1 });
    await until(() => lease.renewals >= 2, "the timer renews every ttl/3");
    assert.ok(lease.alive);
    await lease.complete();
    return walked;
  });
  assert.equal(done.phase, "CONFIRMED");
  const operation = await worker.getOperation(done.operationId);
  assert.equal(operation.phase, "CONFIRMED");
  assert.equal(operation.provider_request_id, "msg-1");
  assert.equal((await worker.getRun(runId)).status, "COMPLETED");
});

test("a perform that throws is reported UNKNOWN, and the replay does not perform again", async () => {
  const runId = await worker.createRun();
  const idempotencyKey = key("charge");
  const request = { tool: "email", action: "send", resource: "mailto:x@example.com", effectClass: "NON_RETRYABLE" as const };
  await worker.withLease(runId, {}, async (lease) => {
    await lease.checkpoint("before-send", { step: 3 });
    await assert.rejects(
      lease.operation({ ...request, idempotencyKey, perform: () => Promise.reject(new Error("the provider did not answer")) }),
      /the provider did not answer/,
    );
  });
  await other.withLease(runId, {}, async (lease) => {
    assert.equal(lease.fencingToken, 2);
    assert.deepEqual([lease.checkpointPosition, lease.checkpointState], ["before-send", { step: 3 }]);
    let performed = 0;
    const replayed = await lease.operation({
      ...request,
      idempotencyKey,
      perform: () => {
        performed += 1;
        return {};
      },
    });
    assert.equal(replayed.phase, "UNKNOWN");
    assert.equal(performed, 0);
  });
});

test("an operation waits for a person's approval, then is dispatched and confirmed", async () => {
  const runId = await worker.createRun();
  let polls = 0;
  const done = await worker.withLease(runId, { ttlS: 5 }, (lease) =>
    lease.operation({
      tool: "payments",
      action: "charge",
      resource: "customer:approve-me",
      effectClass: "NON_RETRYABLE",
      idempotencyKey: key("pay"),
      pollMs: 200,
      onWait: () => {
        polls += 1;
      },
      perform: () => ({ providerRequestId: "ch_1" }),
    }),
  );
  assert.equal(done.phase, "CONFIRMED");
  assert.ok(polls >= 1);
});

test("after a takeover the paused worker's next call is refused as LeaseLost or StaleToken", async () => {
  const runId = await worker.createRun();
  const paused = await worker.lease(runId, { ttlS: 1 }).acquire();
  pause(1600); // its timer cannot renew: the lease expires
  const taker = await other.lease(runId, { ttlS: 30 }).acquire();
  try {
    assert.equal(taker.fencingToken, 2);
    await assert.rejects(paused.event("NOTE", { late: true }), (failure) => {
      assert.ok(failure instanceof LeaseLost || failure instanceof StaleToken, String(failure));
      return true;
    });
    assert.equal(paused.alive, false);
    await assert.rejects(paused.checkpoint("late", {}), (failure) => failure instanceof FencelineError);
  } finally {
    await paused.close(); // nothing to release: it was lost
    await taker.close();
  }
});

test("each refusal is its own error class with the API's code and status", async () => {
  await assert.rejects(worker.getRun("00000000-0000-0000-0000-000000000000"), (failure) => {
    assert.ok(failure instanceof NotFound);
    assert.equal(failure.code, "NOT_FOUND");
    assert.equal(failure.status, 404);
    return true;
  });
  await assert.rejects(new Client(url, { token: "flw_not-a-token" }).getRun(randomUUID()), Unauthorized);
  const runId = await worker.createRun();
  await assert.rejects(worker.lease(runId, { ttlS: 0 }).acquire(), (failure) => {
    assert.ok(failure instanceof InvalidRequest);
    assert.equal(failure.status, 422);
    return true;
  });
  await worker.withLease(runId, {}, async (lease) => {
    await assert.rejects(other.lease(runId).acquire(), LeaseHeld);
    const idempotencyKey = key("same");
    const request = { tool: "email", action: "send", effectClass: "PURE" as const, idempotencyKey, perform: () => ({}) };
    await lease.operation({ ...request, resource: "a" });
    await assert.rejects(lease.operation({ ...request, resource: "b" }), IdempotencyMismatch);
  });
});

test("an AbortSignal aborts a call, a lease's acquisition and the wait for an approval", async () => {
  const aborted = AbortSignal.abort();
  await assert.rejects(worker.createRun({}, { signal: aborted }), { name: "AbortError" });
  const runId = await worker.createRun();
  await assert.rejects(worker.withLease(runId, { signal: aborted }, async () => "never"), { name: "AbortError" });
  const waiting = new AbortController();
  await worker.withLease(runId, { ttlS: 5 }, async (lease) => {
    const walk = lease.operation({
      tool: "payments",
      action: "charge",
      resource: "customer:nobody-decides",
      effectClass: "NON_RETRYABLE",
      idempotencyKey: key("wait"),
      pollMs: 100,
      onWait: () => waiting.abort(),
      signal: waiting.signal,
      perform: () => assert.fail("an operation nobody approved is never performed"),
    });
    await assert.rejects(walk, { name: "AbortError" });
    assert.ok(lease.alive);
  });
});

test("no answer within the timeout is a TransportError, not a refusal", async () => {
  const silent = createServer(() => {}); // accepts the connection, never answers
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const { port } = silent.address() as AddressInfo;
  try {
    const waiting = new Client(`http://127.0.0.1:${port}`, { token: "flw_unused", timeoutMs: 300 });
    await assert.rejects(waiting.createRun(), (failure) => {
      assert.ok(failure instanceof TransportError && !(failure instanceof FencelineError), String(failure));
      return true;
    });
  } finally {
    silent.closeAllConnections();
    silent.close();
  }
});

test("every error code of the server has its own class", () => {
  const codes: string[] = JSON.parse(required("FENCELINE_ERROR_CODES"));
  assert.ok(codes.length > 0);
  assert.deepEqual(
    codes.filter((code) => !(code in ERRORS)),
    [],
    "codes without an error class in src/errors.ts",
  );
  for (const code of codes) assert.equal(errorFor(409, { error: code }).code, code);
});

test("Retry-After is read from the body, else the header", () => {
  const fromBody = errorFor(429, { error: "TOO_MANY_REQUESTS", retry_after_s: 7 }, "3");
  assert.ok(fromBody instanceof RetryLater);
  assert.equal(fromBody.retryAfterS, 7);
  const fromHeader = errorFor(503, { error: "DATABASE_UNAVAILABLE" }, "4");
  assert.ok(fromHeader instanceof RetryLater);
  assert.equal(fromHeader.retryAfterS, 4);
  assert.equal(errorFor(403, { error: "DENY_QUOTA" }).code, "DENY");
  assert.equal(Object.keys(ERRORS).length, new Set(Object.values(ERRORS)).size);
});

test("a traceparent is sent on every call and its trace id kept on the operation", async () => {
  const traceparent = newTraceparent();
  const traced = new Client(url, { token: required("FENCELINE_TOKEN"), traceparent });
  const runId = await traced.createRun({ externalId: key("ts-trace") });
  const walked = await traced.withLease(runId, { ttlS: 30 }, async (lease) =>
    lease.operation({
      tool: "email",
      action: "send",
      resource: "mailto:trace@example.com",
      effectClass: "IDEMPOTENT",
      idempotencyKey: key("trace"),
      perform: async () => ({ providerRequestId: "msg-trace" }),
    }),
  );
  const operation = await traced.getOperation(walked.operationId);
  assert.equal(operation.trace_id, traceparent.split("-")[1]);
  assert.match(traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
});
