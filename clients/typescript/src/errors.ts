/**
 * Every refusal of the API is one error class, by the API's error code (`ERRORS`), as in the
 * Python client (clients/python/src/fenceline_client/client.py). A refusal is a
 * `FencelineError` with `status`, `body` and `detail`; no answer at all is a `TransportError`,
 * which is not a refusal.
 */

/** The JSON body of a refusal: `{"error": CODE, "detail": ...}` and the code's own fields. */
export type ErrorBody = { error?: string; detail?: unknown; [field: string]: unknown };

/** A refusal of the API: `code` and `status` as documented in docs/api.md, `body` as sent. */
export class FencelineError extends Error {
  static readonly code: string = "ERROR";
  readonly status: number;
  readonly body: ErrorBody;
  readonly detail: string;

  constructor(status: number, body: ErrorBody) {
    const detail = body.detail === undefined ? "" : String(body.detail);
    const code = (new.target as typeof FencelineError).code;
    super(`${typeof body.error === "string" && body.error ? body.error : code} (${status}): ${detail}`);
    this.name = new.target.name;
    this.status = status;
    this.body = body;
    this.detail = detail;
  }

  /** The class's code (DENY_* refusals are `Denied`, whose `decision` is the exact code). */
  get code(): string {
    return (this.constructor as typeof FencelineError).code;
  }
}

export class InvalidRequest extends FencelineError {
  static override readonly code = "VALIDATION_ERROR";
}
export class MalformedJSON extends FencelineError {
  static override readonly code = "MALFORMED_JSON";
}
export class PayloadTooLarge extends FencelineError {
  static override readonly code = "PAYLOAD_TOO_LARGE";
}
export class Unauthorized extends FencelineError {
  static override readonly code = "UNAUTHORIZED";
}
export class Forbidden extends FencelineError {
  static override readonly code = "FORBIDDEN";
}
export class ForbiddenField extends FencelineError {
  static override readonly code = "FORBIDDEN_FIELD";
}
export class NotFound extends FencelineError {
  static override readonly code = "NOT_FOUND";
}
export class LeaseHeld extends FencelineError {
  static override readonly code = "LEASE_HELD";
}
/** This worker no longer owns the run: stop acting on it (`body.reason` says why). */
export class LeaseLost extends FencelineError {
  static override readonly code = "LEASE_LOST";
}
/** A write under a token that is not current: the run moved on without this worker. */
export class StaleToken extends FencelineError {
  static override readonly code = "STALE_TOKEN";
}
export class WrongPhase extends FencelineError {
  static override readonly code = "WRONG_PHASE";
}
export class IdempotencyMismatch extends FencelineError {
  static override readonly code = "IDEMPOTENCY_MISMATCH";
}
export class WorkerNotAccepting extends FencelineError {
  static override readonly code: string = "WORKER_NOT_ACCEPTING";
}
/** This worker is draining: finish what is in flight, checkpoint, release, exit. */
export class WorkerDraining extends WorkerNotAccepting {
  static override readonly code = "WORKER_DRAINING";
}
/** The worker's last boot reported a domain not ready: no lease until a ready boot. */
export class NotReady extends WorkerNotAccepting {
  static override readonly code: string = "NOT_READY";
}
export class CredentialsNotReady extends NotReady {
  static override readonly code = "CREDENTIALS_NOT_READY";
}
export class RunCompleted extends FencelineError {
  static override readonly code = "RUN_COMPLETED";
}
/** The run is cancelled or timed out: report what is in flight, then release. */
export class RunCancelled extends FencelineError {
  static override readonly code = "RUN_CANCELLED";
}
export class ReconcileFirst extends FencelineError {
  static override readonly code = "RECONCILE_FIRST";
}
/** The tool contract gives the operation another side-effect class than the one declared. */
export class EffectClassMismatch extends FencelineError {
  static override readonly code = "EFFECT_CLASS_MISMATCH";
}
/** The boot_id was reported already with other content: a new process needs a new id. */
export class BootIdReused extends FencelineError {
  static override readonly code = "BOOT_ID_REUSED";
}
export class ResourceInUse extends FencelineError {
  static override readonly code = "RESOURCE_IN_USE";
}
export class UnknownSchemaVersion extends FencelineError {
  static override readonly code = "UNKNOWN_SCHEMA_VERSION";
}
/** A record of the run disagrees with itself during an upgrade: a person decides. */
export class StateConflict extends FencelineError {
  static override readonly code = "STATE_CONFLICT";
}
/** An upgrade step whose preconditions do not hold (listed so every server code has a class). */
export class UpgradeRefused extends FencelineError {
  static override readonly code = "UPGRADE_REFUSED";
}
/** The tenant was restored from a backup: no authorize or dispatch until a person allows effects. */
export class EffectsHeld extends FencelineError {
  static override readonly code = "EFFECTS_HELD";
}
/** A retry of a NON_RETRYABLE send the provider reports DELIVERED or DEFERRED: sending again would deliver it twice. */
export class AlreadyDelivered extends FencelineError {
  static override readonly code = "ALREADY_DELIVERED";
}
/** A provider webhook whose signature did not verify (the webhook receiver's refusal). */
export class BadSignature extends FencelineError {
  static override readonly code = "BAD_SIGNATURE";
}
/** An event payload of class user_content for a tenant that has not opted in to keep it. */
export class UserContentRefused extends FencelineError {
  static override readonly code = "USER_CONTENT_REFUSED";
}
/** An authority check refused: `decision` is the DENY_* code (`body.budget` / `body.quota` name what). */
export class Denied extends FencelineError {
  static override readonly code = "DENY";
  get decision(): string {
    return String(this.body.decision ?? this.body.error ?? "");
  }
}
/** A person denied the approval an operation waited for (or it expired, or the wait timed out). */
export class ApprovalDenied extends FencelineError {
  static override readonly code = "APPROVAL_DENIED";
}

/**
 * Not decided now: send the same call again after `retryAfterS` seconds (the body's
 * `retry_after_s`, else the `Retry-After` header, else 1).
 */
export class RetryLater extends FencelineError {
  static override readonly code: string = "RETRY_LATER";
  retryAfterHeader: string | null = null;
  get retryAfterS(): number {
    const value = this.body.retry_after_s;
    if (typeof value === "number" && Number.isInteger(value) && value >= 0) return value;
    const header = Number(this.retryAfterHeader);
    return this.retryAfterHeader !== null && Number.isInteger(header) && header >= 0 ? header : 1;
  }
}
/** Too many unknown tokens from this client's address (429): the window ends after `retryAfterS`. */
export class TooManyRequests extends RetryLater {
  static override readonly code = "TOO_MANY_REQUESTS";
}
/** The server cannot reach its database (503): the call was not decided (read back before repeating). */
export class DatabaseUnavailable extends RetryLater {
  static override readonly code = "DATABASE_UNAVAILABLE";
}
/** A flow-control limit of the tenant's policy has no room now (409): the operation stays AUTHORIZED; send the same call again after `retryAfterS`. */
export class Throttled extends RetryLater {
  static override readonly code = "THROTTLED";
}
/** The server's database is a restored image its fence has not been moved on yet (503): nothing was decided. */
export class RestoreUnchecked extends RetryLater {
  static override readonly code = "RESTORE_UNCHECKED";
}
/** A kept value is sealed under a key the server no longer holds (503). */
export class KeyUnavailable extends FencelineError {
  static override readonly code = "KEY_UNAVAILABLE";
}
export class ServerError extends FencelineError {
  static override readonly code = "SERVER_ERROR";
}
/**
 * The server told this worker to stop (`Fenceline-Directive: STOP_WORKER` on a response): it is
 * QUARANTINED. Exit without acting further; a person decides when it may resume.
 */
export class StopWorker extends FencelineError {
  static override readonly code = "STOP_WORKER";
}

/**
 * No answer: the connection failed, broke or timed out. The request may or may not have reached
 * the server; its idempotency makes the same call safe to repeat. Not a refusal, so not a
 * `FencelineError`.
 */
export class TransportError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TransportError";
  }
}

type ErrorClass = new (status: number, body: ErrorBody) => FencelineError;

/** Each error code of the API and its class. */
export const ERRORS: Readonly<Record<string, ErrorClass & { code: string }>> = Object.freeze(
  Object.fromEntries(
    [
      TooManyRequests,
      DatabaseUnavailable,
      RestoreUnchecked,
      Throttled,
      AlreadyDelivered,
      BadSignature,
      KeyUnavailable,
      InvalidRequest,
      MalformedJSON,
      PayloadTooLarge,
      Unauthorized,
      Forbidden,
      ForbiddenField,
      NotFound,
      LeaseHeld,
      LeaseLost,
      StaleToken,
      WrongPhase,
      IdempotencyMismatch,
      WorkerNotAccepting,
      WorkerDraining,
      NotReady,
      CredentialsNotReady,
      RunCompleted,
      RunCancelled,
      ReconcileFirst,
      BootIdReused,
      EffectClassMismatch,
      ResourceInUse,
      UnknownSchemaVersion,
      StateConflict,
      EffectsHeld,
      UpgradeRefused,
      UserContentRefused,
    ].map((cls) => [cls.code, cls]),
  ),
);

/** The error of a refusal: its code's class, `Denied` for DENY_*, `ServerError` for another 5xx. */
export function errorFor(status: number, body: ErrorBody, retryAfter: string | null = null): FencelineError {
  const code = typeof body.error === "string" ? body.error : "";
  if (code.startsWith("DENY_")) return new Denied(status, body);
  const cls = ERRORS[code] ?? (status >= 500 ? ServerError : FencelineError);
  const error = new cls(status, body);
  if (error instanceof RetryLater) error.retryAfterHeader = retryAfter;
  return error;
}
