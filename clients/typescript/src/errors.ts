// Every refusal of the API has one shape, {"error": {"status", "code", "message"}} (docs/api.md, "Errors").
// The client throws it as a JointspaceError: `status` (the HTTP status), `code` (the API's stable,
// machine-readable kind: `not_found`, `rate_limited`, `idempotency_key_reused`, ...) and `message` (the API's
// own words, saying what to change). One subclass per status, so `instanceof NotFoundError` and
// `err.code === "not_found"` both work.

export interface ErrorInit {
  status: number;
  code: string;
  message: string;
  method: string;
  url: string;
  /** Seconds, from the `Retry-After` header, when the server sent one. */
  retryAfter?: number | undefined;
  /** How many times the request was sent before giving up (1: not retried). */
  attempts: number;
  /** The server's `x-request-id`, to find the request in its log. */
  requestId?: string | undefined;
  cause?: unknown;
}

export class JointspaceError extends Error {
  /** The HTTP status; 0 when no answer came (ConnectionError). */
  readonly status: number;
  /** The API's stable error code, e.g. `not_found`, `conflict`, `rate_limited`. */
  readonly code: string;
  readonly method: string;
  readonly url: string;
  /** Seconds the server asked to wait (`Retry-After`), if it said. */
  readonly retryAfter: number | undefined;
  /** Attempts made, retries included. */
  readonly attempts: number;
  readonly requestId: string | undefined;

  constructor(init: ErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.method = init.method;
    this.url = init.url;
    this.retryAfter = init.retryAfter;
    this.attempts = init.attempts;
    this.requestId = init.requestId;
  }
}

/** 400: malformed JSON or form, bad base64, an id that is not a number. */
export class BadRequestError extends JointspaceError {}
/** 401: keys are configured and the request has none, or an unknown one. */
export class UnauthorizedError extends JointspaceError {}
/** 403: the key's role or collections do not allow this request. */
export class ForbiddenError extends JointspaceError {}
/** 404: unknown collection, image, caption or route. */
export class NotFoundError extends JointspaceError {}
/** 408: the request body did not arrive in time; nothing was applied. */
export class RequestTimeoutError extends JointspaceError {}
/** 409: a name or external id taken; an idempotency key still running (`idempotency_in_flight`) or abandoned. */
export class ConflictError extends JointspaceError {}
/** 413: the body, an image file or its pixel count over the server's limits (the message states the limit). */
export class PayloadTooLargeError extends JointspaceError {}
/** 415: a content type or an image format the server does not read. */
export class UnsupportedMediaTypeError extends JointspaceError {}
/** 422: well-formed but unusable (text, k, filter, name; an idempotency key reused for another request). */
export class UnprocessableError extends JointspaceError {}
/** 429: the key's rate (`rate_limited`) or the inference queue (`overloaded`); `retryAfter` says when. */
export class RateLimitedError extends JointspaceError {}
/** 503: the database busy, the request past the server's timeout, a collection not loaded yet. */
export class UnavailableError extends JointspaceError {}
/** Any other 5xx (a proxy's 502, say). */
export class ServerError extends JointspaceError {}
/** No answer: the connection failed or the attempt timed out (status 0, code `connection_error` or `timeout`). */
export class ConnectionError extends JointspaceError {}

const byStatus: Record<number, new (init: ErrorInit) => JointspaceError> = {
  400: BadRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  408: RequestTimeoutError,
  409: ConflictError,
  413: PayloadTooLargeError,
  415: UnsupportedMediaTypeError,
  422: UnprocessableError,
  429: RateLimitedError,
  503: UnavailableError,
};

/** The error class for an HTTP status. */
export function errorFor(init: ErrorInit): JointspaceError {
  const Class = byStatus[init.status] ?? (init.status >= 500 ? ServerError : JointspaceError);
  return new Class(init);
}
