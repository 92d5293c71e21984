/**
 * Fenceline's TypeScript worker client: the lease renewal loop, the fenced calls and the
 * operation walk, so a worker does not hand-write them. It mirrors the Python client
 * (clients/python/src/fenceline_client/client.py); the request and answer types are generated
 * from the server's OpenAPI schema (src/schema.ts, from openapi.json).
 *
 *     const client = new Client("https://fenceline.example", { token });
 *     const runId = await client.createRun({ externalId: "invoice-17" });
 *     await client.withLease(runId, { ttlS: 30 }, async (lease) => {  // renews every ttl/3
 *       await lease.operation({
 *         tool: "payments", action: "charge", resource: "customer:881",
 *         effectClass: "NON_RETRYABLE", idempotencyKey: "charge:881:invoice-17",
 *         perform: async () => ({ providerRequestId: await provider.charge() }),
 *       });
 *       await lease.complete();
 *     });
 *
 * Every call takes an optional `{ signal }` (an AbortSignal); an aborted call rejects with the
 * signal's reason. A renewal that fails in the background (LEASE_LOST, RUN_CANCELLED,
 * STALE_TOKEN ...) is raised at the worker's next call on the lease.
 */

import { createHash, randomBytes, randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

import createClient from "openapi-fetch";

import { type RuntimeAudit, runtimeAudit } from "./audit.js";
import {
  ApprovalDenied,
  FencelineError,
  LeaseLost,
  RetryLater,
  RunCancelled,
  ServerError,
  StaleToken,
  StopWorker,
  TransportError,
  UnknownSchemaVersion,
  errorFor,
  type ErrorBody,
} from "./errors.js";
import type { JsonValue, components, paths } from "./schema.js";

export type Schemas = components["schemas"];
export type EffectClass = NonNullable<Schemas["OperationIn"]["effect_class"]>;
export type Readiness = Schemas["Readiness"];
/** A JSON object the server stores as given (checkpoint state, event fields and payloads). */
export type JsonObject = { [key: string]: JsonValue };

export const SCHEMA_VERSION = 1; // the version of the runs this client creates
/** The operation record versions this client reads (docs/api.md "Record versions and upgrades"). */
export const READS_SCHEMA_VERSIONS: ReadonlySet<number> = new Set([1, 2]);
export const DIRECTIVE_HEADER = "Fenceline-Directive";
export const DEFAULT_CODE_VERSION = "@fenceline/client 0.1.0";
export const DEFAULT_CONFIG_HASH = "unnamed";
// The worker tokens (by digest) whose boot this process has reported: one process is one boot.
const BOOTED = new Set<string>();

/** Every call's last argument. */
export type CallOptions = { signal?: AbortSignal };

/** What `perform` returns when the provider answered: CONFIRMED (the default) or FAILED. */
export type Done = {
  providerRequestId?: string;
  outcome?: "CONFIRMED" | "FAILED" | "UNKNOWN";
  actualCostCents?: number;
  errorCode?: string;
  /** The provider's record, `{id, provider?}`: beside or instead of providerRequestId. */
  providerRef?: { id: string; provider?: string };
  /** This attempt used one of the breaker's fallbacks (`Effect.levers`); left out: not said. */
  fallbackUsed?: boolean;
};

/**
 * What the tenant's policy hands a dispatch while its cost breaker is THROTTLED or DEGRADED:
 * an output ceiling (`max_output_tokens`, null: none) and `fallbacks` (e.g. cheaper models), best first.
 */
export type Levers = Schemas["LeversOut"];

/**
 * Where `effectStart` left an operation: its phase and, while a person must decide, the approval.
 * When the call dispatched it: the cost reservation it made and the breaker's levers (null: none).
 */
export type Effect = {
  operationId: string;
  phase: string;
  approvalId: string | null;
  credentialLeaseId: string | null;
  reservationId?: string | null;
  levers?: Levers | null;
};

export type ClientOptions = {
  token: string;
  /** Connect-and-answer limit of each call, in milliseconds (TransportError past it). */
  timeoutMs?: number;
  /** The operation record versions this build understands. */
  reads?: ReadonlySet<number>;
  /** Another fetch (a proxy agent's, a test's); globalThis.fetch otherwise. */
  fetch?: (input: Request) => Promise<Response>;
  /**
   * A W3C traceparent sent on every call: the server keeps its trace id on the operations and
   * in the chain events those calls write. `newTraceparent()` makes a fresh one.
   */
  traceparent?: string;
};

/** A fresh W3C traceparent (a new, sampled trace). */
export function newTraceparent(): string {
  return `00-${randomBytes(16).toString("hex")}-${randomBytes(8).toString("hex")}-01`;
}

type Answer<T> = { status: number; data: T };
type Sent = { data?: unknown; error?: unknown; response: Response };

/** The `runtime` domain of a boot report: up, with the container self-audit as its evidence. */
export function runtimeReadiness(audit: RuntimeAudit = runtimeAudit()): Schemas["DomainReadiness"] {
  return { ok: true, evidence: { audit } };
}

/**
 * The readiness a lease reports when the worker reported none of its own: the runtime domain
 * with the self-audit, every other domain ready with no evidence.
 */
export function defaultReadiness(): Readiness {
  const ready = { ok: true, evidence: {} };
  return { runtime: runtimeReadiness(), state: ready, credentials: ready, outbound_delivery: ready, admission: ready };
}

/** One worker identity talking to Fenceline over HTTP. */
export class Client {
  readonly api: ReturnType<typeof createClient<paths>>;
  readonly timeoutMs: number;
  readonly reads: ReadonlySet<number>;
  /** True once a response carried `Fenceline-Directive: STOP_WORKER`. */
  stopRequested = false;
  /** Sent as `traceparent` on every call while set; may be changed between calls. */
  traceparent: string | undefined;
  readonly #bootKey: string;

  constructor(baseUrl: string, options: ClientOptions) {
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.reads = options.reads ?? READS_SCHEMA_VERSIONS;
    this.#bootKey = createHash("sha256").update(options.token).digest("hex");
    this.api = createClient<paths>({
      baseUrl: baseUrl.replace(/\/+$/, ""),
      headers: { Authorization: `Bearer ${options.token}` },
      redirect: "manual", // a call is never sent again on the client's own, nor redirected
      ...(options.fetch ? { fetch: options.fetch } : {}),
    });
    this.traceparent = options.traceparent;
    this.api.use({
      onRequest: ({ request }) => {
        if (this.traceparent) request.headers.set("traceparent", this.traceparent);
        return request;
      },
    });
  }

  /**
   * One request, never repeated here: `send(signal)` makes it. A refusal rejects with its error
   * class, no answer (or the timeout) with `TransportError`, the caller's abort with the
   * signal's reason. Resolves to the status and the answer otherwise.
   */
  async call<R extends Sent>(
    what: string,
    send: (signal: AbortSignal) => Promise<R>,
    options?: CallOptions,
  ): Promise<Answer<NonNullable<R["data"]>>> {
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = options?.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    let sent: R;
    try {
      sent = await send(signal);
    } catch (failure) {
      if (options?.signal?.aborted) throw options.signal.reason;
      const why = timeout.aborted ? "no answer within the timeout" : String((failure as Error)?.message ?? failure);
      throw new TransportError(`${what}: ${why}`, { cause: failure });
    }
    const { response } = sent;
    if (response.headers.get(DIRECTIVE_HEADER) === StopWorker.code) this.stopRequested = true;
    if (!response.ok) {
      // a refusal, or a redirect (never followed: a proxy's or a misconfigured address's)
      const body = sent.error;
      const refusal: ErrorBody =
        body !== null && typeof body === "object" && !Array.isArray(body)
          ? (body as ErrorBody)
          : { error: response.status >= 500 ? "SERVER_ERROR" : "", detail: String(body ?? "").slice(0, 200) };
      throw errorFor(response.status, refusal, response.headers.get("Retry-After"));
    }
    return { status: response.status, data: sent.data as NonNullable<R["data"]> };
  }

  /** `record` if this client reads its schema_version; else UnknownSchemaVersion. */
  readable<T extends { schema_version?: number }>(record: T, what = "record"): T {
    const version = record.schema_version ?? 1;
    if (!this.reads.has(version)) {
      const listed = [...this.reads].sort().join(", ");
      throw new UnknownSchemaVersion(409, {
        error: UnknownSchemaVersion.code,
        detail: `${what} has schema_version ${version}; this client reads only ${listed}`,
      });
    }
    return record;
  }

  async createRun(
    run: { externalId?: string; parentRunId?: string; maxRuntimeS?: number } = {},
    options?: CallOptions,
  ): Promise<string> {
    const body: Schemas["RunCreateIn"] = { schema_version: SCHEMA_VERSION };
    if (run.externalId !== undefined) body.external_id = run.externalId;
    if (run.parentRunId !== undefined) body.parent_run_id = run.parentRunId;
    if (run.maxRuntimeS !== undefined) body.max_runtime_s = run.maxRuntimeS;
    const made = await this.call("create run", (signal) => this.api.POST("/api/v1/runs", { body, signal }), options);
    return made.data.run_id;
  }

  async getRun(runId: string, options?: CallOptions): Promise<Schemas["RunOut"]> {
    const path = { run_id: runId };
    const got = await this.call(
      "get run",
      (signal) => this.api.GET("/api/v1/runs/{run_id}", { params: { path }, signal }),
      options,
    );
    return got.data;
  }

  /** An operation as the server holds it (checked readable). */
  async getOperation(operationId: string, options?: CallOptions): Promise<Schemas["OperationOut"]> {
    const path = { operation_id: operationId };
    const got = await this.call(
      "get operation",
      (signal) => this.api.GET("/api/v1/operations/{operation_id}", { params: { path }, signal }),
      options,
    );
    return this.readable(got.data, "operation");
  }

  async getApproval(approvalId: string, options?: CallOptions): Promise<Schemas["ApprovalOut"]> {
    const path = { approval_id: approvalId };
    const got = await this.call(
      "get approval",
      (signal) => this.api.GET("/api/v1/approvals/{approval_id}", { params: { path }, signal }),
      options,
    );
    return got.data;
  }

  /** A lease on `runId`, not yet taken: `acquire()` it and `close()` it, or use `withLease`. */
  lease(runId: string, options: LeaseOptions = {}): Lease {
    return new Lease(this, runId, options);
  }

  /** Acquire the lease, run `work` with it (renewed every ttl/3), then release it (unless the run completed). */
  async withLease<T>(runId: string, options: LeaseOptions, work: (lease: Lease) => Promise<T>): Promise<T> {
    const lease = this.lease(runId, options);
    await lease.acquire({ signal: options.signal });
    try {
      return await work(lease);
    } finally {
      await lease.close();
    }
  }

  /**
   * Report this process's start with its readiness per domain and, unless told otherwise, wait
   * the restart delay the answer gives (abortable through the signal).
   */
  async boot(report: BootReport, options?: CallOptions): Promise<Schemas["BootOut"]> {
    const body: Schemas["BootIn"] = {
      boot_id: randomUUID().replaceAll("-", ""),
      config_hash: report.configHash,
      code_version: report.codeVersion,
      state_schema_version: report.stateSchemaVersion ?? Math.max(...this.reads),
      pid: process.pid,
      host: hostname().slice(0, 200) || "unknown",
      readiness: report.readiness,
    };
    if (report.credentialVersion !== undefined) body.credential_version = report.credentialVersion;
    if (report.error !== undefined) body.error = report.error;
    const answer = await this.call(
      "boot",
      (signal) => this.api.POST("/api/v1/workers/me/boots", { body, signal }),
      options,
    );
    BOOTED.add(this.#bootKey);
    if ((report.honourDelay ?? true) && answer.data.delay_s && !answer.data.quarantined) {
      await sleep(answer.data.delay_s * 1000, undefined, { signal: options?.signal });
    }
    return answer.data;
  }

  /** Whether this process has reported its boot under this worker's token. */
  get booted(): boolean {
    return BOOTED.has(this.#bootKey);
  }

  /** Send the default boot report unless this process has reported its boot already (what a lease does first). */
  async ensureBooted(options?: CallOptions): Promise<void> {
    if (!this.booted) {
      await this.boot(
        { configHash: DEFAULT_CONFIG_HASH, codeVersion: DEFAULT_CODE_VERSION, readiness: defaultReadiness() },
        options,
      );
    }
  }

  async heartbeat(options?: CallOptions): Promise<Schemas["WorkerOut"]> {
    const done = await this.call(
      "heartbeat",
      (signal) => this.api.POST("/api/v1/workers/me/heartbeat", { signal }),
      options,
    );
    return done.data;
  }

  /** What a SIGTERM handler calls first: no new lease, intent or dispatch from now on. */
  async drain(drain: { deadlineS: number; reason?: string }, options?: CallOptions): Promise<Schemas["WorkerOut"]> {
    BOOTED.add(this.#bootKey); // past its start: a later lease sends no boot report
    const body: Schemas["DrainIn"] = { deadline_s: drain.deadlineS };
    if (drain.reason) body.reason = drain.reason;
    const done = await this.call(
      "drain",
      (signal) => this.api.POST("/api/v1/workers/me/drain", { body, signal }),
      options,
    );
    return done.data;
  }

  /** QUIESCED (or DRAINING with no lease left) -> STOPPED: the process's last call. */
  async exit(options?: CallOptions): Promise<Schemas["WorkerOut"]> {
    BOOTED.add(this.#bootKey);
    const done = await this.call(
      "exit",
      (signal) => this.api.POST("/api/v1/workers/me/exit", { signal }),
      options,
    );
    return done.data;
  }
}

export type BootReport = {
  configHash: string;
  codeVersion: string;
  readiness: Readiness;
  stateSchemaVersion?: number;
  credentialVersion?: number;
  error?: Schemas["BootError"];
  honourDelay?: boolean;
};

export type LeaseOptions = { ttlS?: number; ownerId?: string; tool?: string; signal?: AbortSignal };

export type OperationRequest = {
  tool: string;
  action: string;
  resource: string;
  /** The caller's, the same on every retry: a replacement worker replays the same operation. */
  idempotencyKey: string;
  effectClass?: EffectClass;
  credentialLeaseId?: string;
  /** The intent's other fields (args_digest, provider, estimated_cost_cents, payload_bytes). */
  intent?: Omit<Schemas["OperationIn"], "tool" | "action" | "resource" | "idempotency_key" | "effect_class" | "fencing_token">;
};

export type ApprovalWait = {
  timeoutMs?: number;
  pollMs?: number;
  /** Called on every poll with the time waited so far. */
  onWait?: (elapsedMs: number) => void;
  signal?: AbortSignal;
};

/**
 * A held run lease: acquired by `acquire()`, renewed every `ttlS / 3` seconds by a timer,
 * released by `close()` (unless the run was completed). Every call carries the fencing token;
 * a background failure is raised at the next call.
 */
export class Lease {
  readonly client: Client;
  readonly runId: string;
  readonly ttlS: number;
  readonly ownerId: string;
  readonly tool: string | undefined;
  fencingToken = 0;
  checkpointState: JsonObject | null = null;
  checkpointPosition: string | null = null;
  /** Set once a renewal says the run is cancelled (reason, ending, grace_until). */
  cancel: Schemas["CancelOut"] | null = null;
  renewals = 0;
  #failure: FencelineError | null = null;
  #timer: NodeJS.Timeout | null = null;
  #renewing: Promise<void> | null = null;
  readonly #stop = new AbortController();
  #ended = false;
  #notBefore = 0; // a renewal answered Retry-After: none sooner

  constructor(client: Client, runId: string, options: LeaseOptions = {}) {
    this.client = client;
    this.runId = runId;
    this.ttlS = options.ttlS ?? 30;
    this.ownerId = options.ownerId ?? `owner-${randomUUID().replaceAll("-", "").slice(0, 12)}`;
    this.tool = options.tool;
  }

  // -- lifetime --

  /** Send the boot report if this process has not, take the lease, read the latest checkpoint, start renewing. */
  async acquire(options?: CallOptions): Promise<this> {
    await this.client.ensureBooted(options);
    const body: Schemas["LeaseAcquireIn"] = { owner_id: this.ownerId, ttl_s: this.ttlS };
    if (this.tool) body.tool = this.tool;
    const path = { run_id: this.runId };
    const granted = await this.client.call(
      "acquire lease",
      (signal) => this.client.api.POST("/api/v1/runs/{run_id}/lease", { params: { path }, body, signal }),
      options,
    );
    this.fencingToken = granted.data.fencing_token;
    const checkpoint = granted.data.checkpoint;
    if (checkpoint) {
      this.checkpointState = checkpoint.state as JsonObject; // stored as JSON by the server
      this.checkpointPosition = checkpoint.position;
    }
    this.#schedule();
    return this;
  }

  /** Stop renewing and release the lease, unless the run completed or the lease was lost meanwhile. */
  async close(): Promise<void> {
    this.#halt();
    await this.#renewing;
    if (!this.#ended && this.#failure === null) {
      try {
        await this.release();
      } catch (failure) {
        if (!(failure instanceof LeaseLost || failure instanceof StaleToken || failure instanceof RunCancelled)) {
          throw failure; // it ended on its own meanwhile otherwise
        }
      }
    }
  }

  #halt(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#stop.abort();
  }

  #schedule(): void {
    if (this.#stop.signal.aborted) return;
    const interval = Math.max((this.ttlS * 1000) / 3, 200);
    const wait = Math.max(interval, this.#notBefore - Date.now());
    this.#timer = setTimeout(() => {
      this.#renewing = this.#renew().finally(() => {
        this.#renewing = null;
      });
    }, wait);
    this.#timer.unref(); // the lease alone does not keep the process alive
  }

  async #renew(): Promise<void> {
    const path = { run_id: this.runId };
    const body = { owner_id: this.ownerId, fencing_token: this.fencingToken, ttl_s: this.ttlS };
    try {
      const renewed = await this.client.call(
        "renew lease",
        (signal) => this.client.api.POST("/api/v1/runs/{run_id}/lease/renew", { params: { path }, body, signal }),
        { signal: this.#stop.signal },
      );
      this.renewals += 1;
      this.cancel = renewed.data.cancel ?? this.cancel;
    } catch (failure) {
      if (this.#stop.signal.aborted) return; // closed meanwhile
      if (failure instanceof RetryLater) {
        this.#notBefore = Date.now() + failure.retryAfterS * 1000; // honour Retry-After
      } else if (!(failure instanceof TransportError || failure instanceof ServerError)) {
        // LEASE_LOST, STALE_TOKEN, RUN_CANCELLED, a revoked token ...: raised at the next call
        this.#failure = failure instanceof FencelineError ? failure : new ServerError(0, { detail: String(failure) });
        return;
      } // else a passing outage: the lease may still be valid; try again next tick
    }
    if (this.client.stopRequested) return; // raised at the worker's next call
    this.#schedule();
  }

  /** Raise a background failure (or the STOP_WORKER directive) before any call on the lease. */
  check(): void {
    if (this.#failure !== null) throw this.#failure;
    if (this.client.stopRequested) {
      this.#failure = new StopWorker(409, { error: StopWorker.code, detail: "the server told this worker to stop" });
      throw this.#failure;
    }
  }

  get alive(): boolean {
    return this.#failure === null && !this.#ended && !this.client.stopRequested;
  }

  // -- fenced calls --

  /** A fenced call: a background failure is raised first; `send` gets the token to add to its body. */
  async fenced<R extends Sent>(
    what: string,
    send: (token: number, signal: AbortSignal) => Promise<R>,
    options?: CallOptions,
  ): Promise<Answer<NonNullable<R["data"]>>> {
    this.check();
    try {
      return await this.client.call(what, (signal) => send(this.fencingToken, signal), options);
    } catch (failure) {
      if (failure instanceof LeaseLost || failure instanceof StaleToken || failure instanceof RunCancelled) {
        this.#failure ??= failure;
      }
      throw failure;
    }
  }

  async checkpoint(position: string, state: JsonObject, options?: CallOptions): Promise<Schemas["CheckpointSavedOut"]> {
    const path = { run_id: this.runId };
    const saved = await this.fenced(
      "checkpoint",
      (fencing_token, signal) =>
        this.client.api.POST("/api/v1/runs/{run_id}/checkpoints", {
          params: { path },
          body: { fencing_token, position, state },
          signal,
        }),
      options,
    );
    this.checkpointState = state;
    this.checkpointPosition = position;
    return saved.data;
  }

  /**
   * Append an event: `fields` go into the chain for good; `payload`, if given, into the
   * diagnostic plane for the tenant's retention, the chain committing to its digest.
   */
  async event(
    type: string,
    fields: JsonObject,
    extra: { payload?: JsonObject; payloadClass?: "event_payload" | "user_content" } & CallOptions = {},
  ): Promise<Schemas["EventAppendedOut"]> {
    const path = { run_id: this.runId };
    const appended = await this.fenced(
      "event",
      (fencing_token, signal) => {
        const body: Schemas["EventIn"] = { fencing_token, type, fields };
        if (extra.payload !== undefined) {
          body.payload = extra.payload;
          body.payload_class = extra.payloadClass ?? "event_payload";
        }
        return this.client.api.POST("/api/v1/runs/{run_id}/events", { params: { path }, body, signal });
      },
      extra,
    );
    return appended.data;
  }

  /** Register a resource the run holds; returns its id (the reaper closes it later through its driver). */
  async attach(
    kind: Schemas["ResourceKind"],
    provider: string,
    handle: string,
    limits: { ttlS?: number; idleS?: number } & CallOptions = {},
  ): Promise<string> {
    const path = { run_id: this.runId };
    const attached = await this.fenced(
      "attach",
      (fencing_token, signal) => {
        const body: Schemas["ResourceIn"] = { fencing_token, kind, provider, handle };
        if (limits.ttlS !== undefined) body.ttl_s = limits.ttlS;
        if (limits.idleS !== undefined) body.idle_s = limits.idleS;
        return this.client.api.POST("/api/v1/runs/{run_id}/resources", { params: { path }, body, signal });
      },
      limits,
    );
    return attached.data.resource_id;
  }

  async releaseResource(resourceId: string, options?: CallOptions): Promise<Schemas["ResourceOut"]> {
    const path = { resource_id: resourceId };
    const released = await this.fenced(
      "release resource",
      (fencing_token, signal) =>
        this.client.api.POST("/api/v1/resources/{resource_id}/release", { params: { path }, body: { fencing_token }, signal }),
      options,
    );
    return released.data;
  }

  // -- the operation walk --

  /**
   * Intent -> authorize (waiting for a person's approval when one is needed) -> dispatch ->
   * `perform()` -> outcome. If `perform` throws, the outcome is reported UNKNOWN (nobody knows
   * whether the effect happened) and the error propagates. The signal aborts the calls and the
   * wait for approval; it does not stop the UNKNOWN report of a `perform` that threw.
   */
  async operation(
    request: OperationRequest & { perform: () => Done | Promise<Done> } & ApprovalWait,
  ): Promise<{ operationId: string; phase: string }> {
    const options = { signal: request.signal };
    let started = await this.effectStart(request, options);
    if (started.approvalId !== null) started = await this.effectAwaitApproval(started, request);
    if (started.phase !== "DISPATCHED") return { operationId: started.operationId, phase: started.phase }; // decided earlier
    let done: Done;
    try {
      done = await request.perform();
    } catch (failure) {
      await this.effectOutcome(started.operationId, { outcome: "UNKNOWN" });
      throw failure;
    }
    return { operationId: started.operationId, phase: await this.effectOutcome(started.operationId, done, options) };
  }

  /**
   * Intend, authorize and dispatch, as far as nothing waits for a person, in one call
   * (`POST /runs/{run_id}/effects`). Returns DISPATCHED (call the provider now, then
   * `effectOutcome`; also when an earlier call under the same key dispatched and reported
   * nothing: the provider gets the same idempotency key), PENDING_APPROVAL with `approvalId`
   * set (`effectAwaitApproval`), or a phase an earlier attempt under the same key reached
   * (CONFIRMED, FAILED, UNKNOWN, DENIED ...: do not call the provider).
   */
  async effectStart(request: OperationRequest, options?: CallOptions): Promise<Effect> {
    const credentialLeaseId = request.credentialLeaseId ?? null;
    const started = await this.fenced(
      "effect",
      (fencing_token, signal) => {
        const body: Schemas["EffectIn"] = {
          ...request.intent,
          fencing_token,
          tool: request.tool,
          action: request.action,
          resource: request.resource,
          idempotency_key: request.idempotencyKey,
          // A record this build cannot read is answered as intended and goes no further; refused below.
          reads_schema_versions: [...this.client.reads].sort(),
        };
        if (request.effectClass !== undefined) body.effect_class = request.effectClass;
        if (credentialLeaseId) body.credential_lease_id = credentialLeaseId;
        const path = { run_id: this.runId };
        return this.client.api.POST("/api/v1/runs/{run_id}/effects", { params: { path }, body, signal });
      },
      options,
    );
    const effect = this.client.readable(started.data as Schemas["EffectOut"], "operation");
    return {
      operationId: effect.operation_id,
      phase: effect.phase,
      approvalId: effect.approval_id,
      credentialLeaseId,
      reservationId: effect.reservation_id ?? null,
      levers: effect.levers ?? null,
    };
  }

  #authorize(operationId: string, credentialLeaseId: string | null, options?: CallOptions) {
    const path = { operation_id: operationId };
    return this.fenced(
      "authorize",
      (fencing_token, signal) => {
        const body: Schemas["AuthorizeIn"] = { fencing_token };
        if (credentialLeaseId) body.credential_lease_id = credentialLeaseId;
        return this.client.api.POST("/api/v1/operations/{operation_id}/authorize", { params: { path }, body, signal });
      },
      options,
    );
  }

  async #dispatch(operationId: string, options?: CallOptions): Promise<Schemas["DispatchOut"]> {
    const path = { operation_id: operationId };
    const dispatched = await this.fenced(
      "dispatch",
      (fencing_token, signal) =>
        this.client.api.POST("/api/v1/operations/{operation_id}/dispatch", { params: { path }, body: { fencing_token }, signal }),
      options,
    );
    return dispatched.data as Schemas["DispatchOut"];
  }

  /**
   * Wait for a person's decision on `effect.approvalId` (the lease keeps renewing); once
   * APPROVED, authorize and dispatch. DENIED, EXPIRED, VOID or the timeout reject with
   * `ApprovalDenied`: an approval that expires never approves. The signal ends the wait.
   */
  async effectAwaitApproval(effect: Effect, wait: ApprovalWait = {}): Promise<Effect> {
    if (effect.approvalId === null) return effect;
    const options = { signal: wait.signal };
    const started = Date.now();
    const deadline = started + (wait.timeoutMs ?? 600_000);
    while (Date.now() < deadline) {
      await sleep(Math.min(wait.pollMs ?? 2000, Math.max(deadline - Date.now(), 0)), undefined, options);
      this.check();
      wait.onWait?.(Date.now() - started);
      const decided = await this.client.getApproval(effect.approvalId, options);
      if (decided.status === "APPROVED") {
        await this.#authorize(effect.operationId, effect.credentialLeaseId, options);
        const dispatched = await this.#dispatch(effect.operationId, options);
        return {
          ...effect,
          phase: "DISPATCHED",
          approvalId: null,
          reservationId: dispatched.reservation_id ?? null,
          levers: dispatched.levers ?? null,
        };
      }
      if (["DENIED", "EXPIRED", "VOID"].includes(decided.status)) {
        const detail = decided.reason || decided.status.toLowerCase();
        throw new ApprovalDenied(403, { error: ApprovalDenied.code, detail });
      }
    }
    throw new ApprovalDenied(408, { error: ApprovalDenied.code, detail: "no decision before the timeout" });
  }

  /** Report what the provider answered (`{outcome: "UNKNOWN"}` when nobody knows): returns the operation's phase. */
  async effectOutcome(operationId: string, done: Done, options?: CallOptions): Promise<string> {
    const path = { operation_id: operationId };
    const reported = await this.fenced(
      "outcome",
      (fencing_token, signal) => {
        const body: Schemas["OutcomeIn"] = { fencing_token, outcome: done.outcome ?? "CONFIRMED" };
        if (done.providerRequestId) body.provider_request_id = done.providerRequestId;
        if (done.providerRef !== undefined) body.provider_ref = done.providerRef;
        if (done.actualCostCents !== undefined) body.actual_cost_cents = done.actualCostCents;
        if (done.errorCode) body.error_code = done.errorCode;
        if (done.fallbackUsed !== undefined) body.fallback_used = done.fallbackUsed;
        return this.client.api.POST("/api/v1/operations/{operation_id}/outcome", { params: { path }, body, signal });
      },
      options,
    );
    return reported.data.phase;
  }

  // -- the end --

  async complete(options?: CallOptions): Promise<Schemas["RunCreatedOut"]> {
    const path = { run_id: this.runId };
    const done = await this.fenced(
      "complete",
      (fencing_token, signal) =>
        this.client.api.POST("/api/v1/runs/{run_id}/complete", { params: { path }, body: { fencing_token }, signal }),
      options,
    );
    this.#ended = true;
    this.#halt();
    return done.data;
  }

  async release(options?: CallOptions): Promise<Schemas["LeaseReleasedOut"]> {
    this.#halt();
    const path = { run_id: this.runId };
    const body = { owner_id: this.ownerId, fencing_token: this.fencingToken };
    const done = await this.client.call(
      "release lease",
      (signal) => this.client.api.POST("/api/v1/runs/{run_id}/lease/release", { params: { path }, body, signal }),
      options,
    );
    this.#ended = true;
    return done.data;
  }

  async cancelRun(reason: string, options?: CallOptions): Promise<Schemas["CancelledOut"]> {
    const path = { run_id: this.runId };
    const done = await this.client.call(
      "cancel run",
      (signal) => this.client.api.POST("/api/v1/runs/{run_id}/cancel", { params: { path }, body: { reason }, signal }),
      options,
    );
    return done.data;
  }
}
