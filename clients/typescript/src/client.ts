// A thin client for the jointspace HTTP API over the global `fetch` (browsers, Node 20+, Deno, Bun): no
// runtime dependency. Each method is one operation of openapi.yaml; its answer is the API's JSON as typed in
// src/schema.ts (generated from the contract). Refusals are thrown as JointspaceError subclasses (errors.ts).
//
// Retries: 429 (the key's rate or the inference queue) always, since the server refused it before doing
// anything; 503, 408 and failed connections only when sending the request again cannot do it twice: reads,
// searches, PUT/PATCH/DELETE (idempotent by themselves) and the POSTs that write, which carry an
// `Idempotency-Key` (one per call, the same on every attempt: the server gives a retry the first answer
// again instead of running it twice); and 409 `idempotency_in_flight` (the first attempt is still running).
// The wait is the server's `Retry-After` when it sends one, else an exponential backoff with jitter, within a
// budget of attempts and of total time: when the next wait would pass the budget, the last error is thrown
// at once rather than after a pointless sleep.

import {
  ConnectionError,
  JointspaceError,
  errorFor,
} from "./errors.js";
import { imageData, imageSource, type ImageInput } from "./images.js";
import type {
  AddedImage,
  AddedImages,
  BundleInfo,
  Caption,
  CaptionList,
  CaptionResult,
  CaptionResults,
  Collection,
  CreateCollection,
  EmbedImageResponse,
  EmbedTextResponse,
  ExportLine,
  Health,
  Image,
  ImageList,
  ImagePatch,
  ImageResult,
  ImageResults,
  ItemError,
  JsonObject,
  NewCaption,
  NewImage,
  Readiness,
  ReindexReport,
  SearchQuery,
  SnapshotReport,
  SyncFeed,
  SyncJob,
  UpsertImage,
  UpsertedImage,
} from "./types.js";

export interface RetryOptions {
  /** Most attempts in all, the first included (1: never retry). Default 5. */
  maxAttempts: number;
  /** Most milliseconds from the first attempt to the last one's start, waits included. Default 60000. */
  maxTotalMs: number;
  /** First backoff when the server gives no Retry-After (doubled each attempt, with jitter). Default 250. */
  baseDelayMs: number;
  /** Longest backoff without Retry-After. A Retry-After is honoured as given, within maxTotalMs. Default 8000. */
  maxDelayMs: number;
  /** Called before each wait, e.g. to log it. */
  onRetry?: ((info: RetryInfo) => void) | undefined;
}

export interface RetryInfo {
  /** The attempt that failed (1 for the first). */
  attempt: number;
  /** How long the client waits before the next attempt. */
  delayMs: number;
  /** Why: the error that attempt got. */
  error: JointspaceError;
}

export interface ClientOptions {
  /** Where the server is, e.g. `http://localhost:8080` (a path prefix is kept: `https://host/jointspace`). */
  baseUrl: string;
  /** An API key, sent as `Authorization: Bearer <key>` (docs/operations.md, "API keys"). */
  apiKey?: string | undefined;
  /** The retry budget; `false` or `{maxAttempts: 1}` for none. */
  retry?: Partial<RetryOptions> | false;
  /** Milliseconds one attempt may take before it is abandoned (and retried when that is safe). None by default. */
  timeoutMs?: number | undefined;
  /** Send a generated `Idempotency-Key` with every POST that writes (default true). */
  idempotencyKeys?: boolean;
  /** Headers sent with every request. */
  headers?: Record<string, string>;
  /** A fetch to use instead of the global one (bound to globalThis when omitted). */
  fetch?: typeof fetch;
}

/** Options every call takes. */
export interface CallOptions {
  signal?: AbortSignal | undefined;
  /** This call's retry budget, over the client's. */
  retry?: Partial<RetryOptions> | false;
}

/** Options of the POSTs that write. */
export interface WriteOptions extends CallOptions {
  /**
   * The `Idempotency-Key` to send (1-255 visible ASCII characters). By default each call makes a new UUID and
   * keeps it for its retries; give your own to retry across processes (a key's answer is kept for 24 hours).
   */
  idempotencyKey?: string | undefined;
}

export interface PageOptions extends CallOptions {
  offset?: number;
  limit?: number;
}

export interface ListImagesOptions extends PageOptions {
  /** A metadata filter (docs/api.md, "Filters"), e.g. `{"price": {"$lt": 50}}`. */
  filter?: JsonObject | undefined;
  external_id?: string | undefined;
}

export interface ListCaptionsOptions extends PageOptions {
  image_id?: number | undefined;
}

export interface IterOptions {
  /** Results per request (the request's `k` or `limit`). */
  pageSize?: number;
  /** Most items to yield in all. */
  max?: number;
}

export interface ImportOptions extends CallOptions {
  /** Images per request (at most the server's --max-batch, 64 by default). Default 16. */
  batchSize?: number;
  /** Per batch: store none of the batch when one of its images (given by URL) fails. */
  all_or_nothing?: boolean;
  /** Called after each batch is stored. */
  onBatch?: (info: { batch: number; added: number; errors: number }) => void;
}

export interface ImportResult {
  /** Every image stored, `index` being its position in the whole input. */
  images: AddedImage[];
  /** Images given by URL that were not stored, `index` being their position in the whole input. */
  errors: ItemError[];
}

const DEFAULT_RETRY: RetryOptions = {
  maxAttempts: 5,
  maxTotalMs: 60_000,
  baseDelayMs: 250,
  maxDelayMs: 8_000,
};

type Method = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

interface RequestSpec {
  method: Method;
  path: string;
  query?: Record<string, string | number | undefined | null> | undefined;
  json?: unknown;
  /** A raw body (a catalogue feed) and its content type. */
  body?: string;
  contentType?: string;
  /** Sending it twice cannot apply it twice (set for reads and searches; keyed writes are so by their key). */
  repeatable: boolean;
  /** A POST that writes: gets an Idempotency-Key. */
  write?: boolean;
  idempotencyKey?: string | undefined;
  /** Statuses that are answers rather than errors (a 503 from /readyz says what is not ready). */
  accept?: number[];
  accept_header?: string;
  options?: CallOptions | undefined;
}

/** A path segment: collection names, ids and external ids (an external id may hold `/`: it becomes %2F). */
function seg(v: string | number): string {
  return encodeURIComponent(String(v));
}

/** `Retry-After` as milliseconds: delta-seconds or an HTTP date. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** A UUID v4 for an Idempotency-Key: crypto.randomUUID where there is one (secure contexts), else from getRandomValues. */
export function newIdempotencyKey(): string {
  const c = globalThis.crypto;
  if (typeof c?.randomUUID === "function") return c.randomUUID();
  const b = new Uint8Array(16);
  c.getRandomValues(b);
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The caller's signal and this attempt's timeout as one signal. */
function attemptSignal(caller: AbortSignal | undefined, timeoutMs: number | undefined): AbortSignal | undefined {
  if (timeoutMs === undefined) return caller;
  const timeout = AbortSignal.timeout(timeoutMs);
  if (caller === undefined) return timeout;
  if (typeof AbortSignal.any === "function") return AbortSignal.any([caller, timeout]);
  const both = new AbortController();
  for (const s of [caller, timeout]) {
    if (s.aborted) both.abort(s.reason);
    else s.addEventListener("abort", () => both.abort(s.reason), { once: true });
  }
  return both.signal;
}

export class JointspaceClient {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly retry: RetryOptions;
  private readonly timeoutMs: number | undefined;
  private readonly idempotencyKeys: boolean;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options || typeof options.baseUrl !== "string" || options.baseUrl === "") {
      throw new TypeError("JointspaceClient needs a baseUrl, e.g. http://localhost:8080");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.retry =
      options.retry === false ? { ...DEFAULT_RETRY, maxAttempts: 1 } : { ...DEFAULT_RETRY, ...options.retry };
    this.timeoutMs = options.timeoutMs;
    this.idempotencyKeys = options.idempotencyKeys ?? true;
    this.headers = { ...options.headers };
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // ---- the transport ----------------------------------------------------------------------------------

  private url(path: string, query?: RequestSpec["query"]): string {
    let url = this.baseUrl + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) q.set(k, String(v));
      const s = q.toString();
      if (s) url += `?${s}`;
    }
    return url;
  }

  /** Sends one request with the retry policy; answers its Response when it is a success (or accepted). */
  private async send(spec: RequestSpec): Promise<Response> {
    const callRetry = spec.options?.retry;
    const budget: RetryOptions =
      callRetry === false ? { ...this.retry, maxAttempts: 1 } : { ...this.retry, ...callRetry };
    const url = this.url(spec.path, spec.query);
    const headers: Record<string, string> = { accept: spec.accept_header ?? "application/json", ...this.headers };
    if (this.apiKey !== undefined) headers.authorization = `Bearer ${this.apiKey}`;
    let body: string | undefined;
    if (spec.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(spec.json);
    } else if (spec.body !== undefined) {
      headers["content-type"] = spec.contentType ?? "application/octet-stream";
      body = spec.body;
    }
    let repeatable = spec.repeatable;
    if (spec.write) {
      const key = spec.idempotencyKey ?? (this.idempotencyKeys ? newIdempotencyKey() : undefined);
      if (key !== undefined) {
        headers["idempotency-key"] = key;
        repeatable = true;
      }
    }
    const caller = spec.options?.signal;
    const started = Date.now();
    for (let attempt = 1; ; attempt++) {
      let failure: JointspaceError;
      let retryable: boolean;
      let waitMs: number | undefined;
      const signal = attemptSignal(caller, this.timeoutMs);
      try {
        const res = await this.fetchImpl(url, {
          method: spec.method,
          headers,
          ...(body === undefined ? {} : { body }),
          ...(signal === undefined ? {} : { signal }),
        });
        if (res.ok || spec.accept?.includes(res.status)) return res;
        failure = await this.errorOf(res, spec.method, url, attempt);
        waitMs = parseRetryAfter(res.headers.get("retry-after"));
        retryable =
          res.status === 429 ||
          ((res.status === 503 || res.status === 408) && repeatable) ||
          (res.status === 409 && failure.code === "idempotency_in_flight");
      } catch (e) {
        if (caller?.aborted) throw caller.reason ?? e;
        if (e instanceof JointspaceError) throw e;
        const timedOut = e instanceof DOMException && (e.name === "TimeoutError" || e.name === "AbortError");
        failure = new ConnectionError({
          status: 0,
          code: timedOut ? "timeout" : "connection_error",
          message: timedOut
            ? `${spec.method} ${url}: no answer within ${this.timeoutMs} ms`
            : `${spec.method} ${url}: ${e instanceof Error ? e.message : String(e)}${
                e instanceof Error && e.cause instanceof Error ? ` (${e.cause.message})` : ""
              }`,
          method: spec.method,
          url,
          attempts: attempt,
          cause: e,
        });
        retryable = repeatable;
      }
      const delay =
        waitMs ??
        Math.min(budget.maxDelayMs, budget.baseDelayMs * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
      if (!retryable || attempt >= budget.maxAttempts || Date.now() - started + delay > budget.maxTotalMs) {
        throw failure;
      }
      budget.onRetry?.({ attempt, delayMs: delay, error: failure });
      await sleep(delay, caller);
    }
  }

  private async errorOf(res: Response, method: string, url: string, attempts: number): Promise<JointspaceError> {
    const text = await res.text().catch(() => "");
    let code = `http_${res.status}`;
    let message = `${res.status} ${res.statusText}`.trim() + (text ? `: ${text.slice(0, 500)}` : "");
    try {
      const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
      if (parsed?.error && typeof parsed.error.code === "string" && typeof parsed.error.message === "string") {
        code = parsed.error.code;
        message = parsed.error.message;
      }
    } catch {
      // not the API's error shape (a proxy's page, say): keep the status and the text
    }
    const ra = parseRetryAfter(res.headers.get("retry-after"));
    return errorFor({
      status: res.status,
      code,
      message,
      method,
      url,
      attempts,
      retryAfter: ra === undefined ? undefined : ra / 1000,
      requestId: res.headers.get("x-request-id") ?? undefined,
    });
  }

  private async json<T>(spec: RequestSpec): Promise<T> {
    const res = await this.send(spec);
    return (await res.json()) as T;
  }

  private async none(spec: RequestSpec): Promise<void> {
    const res = await this.send(spec);
    await res.body?.cancel();
  }

  // ---- system -------------------------------------------------------------------------------------------

  /** GET /healthz: `{status: "ok"}`, or the 503's answer when an inference worker has stopped. */
  health(options?: CallOptions): Promise<Health> {
    return this.json({ method: "GET", path: "/healthz", repeatable: true, accept: [503], options });
  }

  /** GET /readyz: every part's readiness; `ready` false (a 503) is an answer, not an error, and is not retried. */
  ready(options?: CallOptions): Promise<Readiness> {
    return this.json({ method: "GET", path: "/readyz", repeatable: true, accept: [503], options });
  }

  /** GET /v1/bundle: the loaded model bundle. */
  bundle(options?: CallOptions): Promise<BundleInfo> {
    return this.json({ method: "GET", path: "/v1/bundle", repeatable: true, options });
  }

  /** GET /openapi.yaml: the contract, as the server serves it. */
  async openapi(options?: CallOptions): Promise<string> {
    const res = await this.send({
      method: "GET",
      path: "/openapi.yaml",
      repeatable: true,
      accept_header: "application/yaml",
      options,
    });
    return res.text();
  }

  /** GET /metrics: Prometheus text. */
  async metrics(options?: CallOptions): Promise<string> {
    const res = await this.send({ method: "GET", path: "/metrics", repeatable: true, accept_header: "text/plain", options });
    return res.text();
  }

  // ---- collections -------------------------------------------------------------------------------------

  /** POST /v1/collections (admin key). 409 `conflict` when the name is taken. */
  createCollection(collection: CreateCollection, options?: WriteOptions): Promise<Collection> {
    return this.json({
      method: "POST",
      path: "/v1/collections",
      json: collection,
      repeatable: false,
      write: true,
      idempotencyKey: options?.idempotencyKey,
      options,
    });
  }

  /** GET /v1/collections: the collections this key may see, with their counts. */
  async listCollections(options?: CallOptions): Promise<Collection[]> {
    const r = await this.json<{ collections: Collection[] }>({
      method: "GET",
      path: "/v1/collections",
      repeatable: true,
      options,
    });
    return r.collections;
  }

  getCollection(name: string, options?: CallOptions): Promise<Collection> {
    return this.json({ method: "GET", path: `/v1/collections/${seg(name)}`, repeatable: true, options });
  }

  /** DELETE /v1/collections/{name} with everything in it (admin key). */
  deleteCollection(name: string, options?: CallOptions): Promise<void> {
    return this.none({ method: "DELETE", path: `/v1/collections/${seg(name)}`, repeatable: true, options });
  }

  /**
   * GET /v1/collections/{name}/export, streamed and parsed line by line: a `header`, the `image` and `caption`
   * lines, and the `end` line, checked against the lines seen (an export without it, or whose counts disagree,
   * was cut short: a JointspaceError with code `export_truncated` is thrown). Write each line back with
   * `JSON.stringify(line) + "\n"` for `jointspace import`.
   */
  async *exportCollection(name: string, options?: CallOptions): AsyncGenerator<ExportLine, void, undefined> {
    const res = await this.send({
      method: "GET",
      path: `/v1/collections/${seg(name)}/export`,
      repeatable: true,
      accept_header: "application/x-ndjson",
      options,
    });
    const url = res.url || this.url(`/v1/collections/${seg(name)}/export`);
    const truncated = (why: string) =>
      new JointspaceError({ status: res.status, code: "export_truncated", message: why, method: "GET", url, attempts: 1 });
    const counts = { images: 0, captions: 0 };
    let ended: { images: number; captions: number } | undefined;
    let first = true;
    const handle = (raw: string): ExportLine | undefined => {
      if (raw.trim() === "") return undefined;
      const line = JSON.parse(raw) as ExportLine;
      if (first && !("header" in line)) throw truncated("the export does not start with its header line");
      first = false;
      if (ended) throw truncated("the export has lines after its end line");
      if ("image" in line) counts.images++;
      else if ("caption" in line) counts.captions++;
      else if ("end" in line) ended = line.end;
      return line;
    };
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let rest = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        rest += value;
        let nl: number;
        while ((nl = rest.indexOf("\n")) >= 0) {
          const line = handle(rest.slice(0, nl));
          rest = rest.slice(nl + 1);
          if (line) yield line;
        }
      }
      const last = handle(rest);
      if (last) yield last;
    } finally {
      reader.releaseLock();
    }
    if (!ended) throw truncated(`the export of ${name} ended without its end line: it was cut short`);
    if (ended.images !== counts.images || ended.captions !== counts.captions) {
      throw truncated(
        `the export of ${name} counts ${ended.images} images and ${ended.captions} captions but holds ${counts.images} and ${counts.captions}`,
      );
    }
  }

  // ---- images ------------------------------------------------------------------------------------------

  /**
   * POST /v1/collections/{c}/images: one batch (at most the server's --max-batch), stored all or nothing, with
   * an Idempotency-Key so that a retry never stores the photos twice. Images given by URL that fail are listed
   * in `errors` (docs/api.md, "URL ingest").
   */
  async addImages(
    collection: string,
    images: NewImage[],
    options?: WriteOptions & { all_or_nothing?: boolean },
  ): Promise<AddedImages> {
    const items = await Promise.all(
      images.map(async ({ image, ...rest }) => ({ ...(await imageSource(image)), ...rest })),
    );
    return this.json({
      method: "POST",
      path: `/v1/collections/${seg(collection)}/images`,
      json: { images: items, ...(options?.all_or_nothing === undefined ? {} : { all_or_nothing: options.all_or_nothing }) },
      repeatable: false,
      write: true,
      idempotencyKey: options?.idempotencyKey,
      options,
    });
  }

  /** One image: addImages with a batch of one, answering what was stored. */
  async addImage(collection: string, image: NewImage, options?: WriteOptions): Promise<AddedImage> {
    const r = await this.addImages(collection, [image], options);
    return r.images[0]!;
  }

  /**
   * Adds images from any iterable (a generator reading a catalogue, say) in batches of `batchSize`, each its own
   * request with its own Idempotency-Key. Stops at the first batch refused, with what was stored before it
   * stored (the error names the batch: `err.cause`-free, its message says which).
   */
  async importImages(
    collection: string,
    images: Iterable<NewImage> | AsyncIterable<NewImage>,
    options?: ImportOptions,
  ): Promise<ImportResult> {
    const size = options?.batchSize ?? 16;
    if (!(size >= 1)) throw new RangeError("batchSize must be at least 1");
    const out: ImportResult = { images: [], errors: [] };
    let batch: NewImage[] = [];
    let base = 0;
    let n = 0;
    const flush = async () => {
      const r = await this.addImages(collection, batch, {
        signal: options?.signal,
        retry: options?.retry ?? {},
        ...(options?.all_or_nothing === undefined ? {} : { all_or_nothing: options.all_or_nothing }),
      });
      for (const im of r.images) out.images.push({ ...im, index: base + im.index });
      for (const e of r.errors ?? []) out.errors.push({ ...e, index: base + e.index });
      options?.onBatch?.({ batch: n++, added: r.images.length, errors: r.errors?.length ?? 0 });
      base += batch.length;
      batch = [];
    };
    for await (const image of images) {
      batch.push(image);
      if (batch.length >= size) await flush();
    }
    if (batch.length > 0) await flush();
    return out;
  }

  /** GET /v1/collections/{c}/images: one page, with `total`. */
  listImages(collection: string, options?: ListImagesOptions): Promise<ImageList> {
    return this.json({
      method: "GET",
      path: `/v1/collections/${seg(collection)}/images`,
      query: {
        offset: options?.offset,
        limit: options?.limit,
        filter: options?.filter === undefined ? undefined : JSON.stringify(options.filter),
        external_id: options?.external_id,
      },
      repeatable: true,
      options,
    });
  }

  /** Every image (that the filter admits), page after page. */
  async *listImagesIter(
    collection: string,
    options?: Omit<ListImagesOptions, "limit"> & IterOptions,
  ): AsyncGenerator<Image, void, undefined> {
    const pageSize = options?.pageSize ?? 100;
    let offset = options?.offset ?? 0;
    let left = options?.max ?? Infinity;
    while (left > 0) {
      const page = await this.listImages(collection, { ...options, offset, limit: Math.min(pageSize, left) });
      for (const im of page.images) yield im;
      left -= page.images.length;
      offset += page.images.length;
      if (page.images.length === 0 || offset >= page.total) return;
    }
  }

  getImage(collection: string, id: number, options?: CallOptions): Promise<Image> {
    return this.json({ method: "GET", path: `/v1/collections/${seg(collection)}/images/${seg(id)}`, repeatable: true, options });
  }

  getImageByExternalId(collection: string, externalId: string, options?: CallOptions): Promise<Image> {
    return this.json({
      method: "GET",
      path: `/v1/collections/${seg(collection)}/images/by-external-id/${seg(externalId)}`,
      repeatable: true,
      options,
    });
  }

  /**
   * PATCH /v1/collections/{c}/images/{id}: `metadata` is a JSON merge patch (a key set to null is removed),
   * `external_id` sets it (null removes it; 409 if another image has it). Answers the image as it now is.
   */
  patchImage(collection: string, id: number, patch: ImagePatch, options?: CallOptions): Promise<Image> {
    return this.json({
      method: "PATCH",
      path: `/v1/collections/${seg(collection)}/images/${seg(id)}`,
      json: patch,
      repeatable: true,
      options,
    });
  }

  /**
   * PUT /v1/collections/{c}/images/by-external-id/{externalId}: the image whole. `outcome` says what happened:
   * `created`, `updated` (the same photo: metadata and captions replaced, same id) or `replaced` (a new photo,
   * under a new id; `previous_id` names the old one).
   */
  async upsertImage(
    collection: string,
    externalId: string,
    image: UpsertImage,
    options?: CallOptions,
  ): Promise<UpsertedImage> {
    const { image: photo, ...rest } = image;
    return this.json({
      method: "PUT",
      path: `/v1/collections/${seg(collection)}/images/by-external-id/${seg(externalId)}`,
      json: { data: await imageData(photo, "an upsert"), ...rest },
      repeatable: true,
      options,
    });
  }

  deleteImage(collection: string, id: number, options?: CallOptions): Promise<void> {
    return this.none({ method: "DELETE", path: `/v1/collections/${seg(collection)}/images/${seg(id)}`, repeatable: true, options });
  }

  deleteImageByExternalId(collection: string, externalId: string, options?: CallOptions): Promise<void> {
    return this.none({
      method: "DELETE",
      path: `/v1/collections/${seg(collection)}/images/by-external-id/${seg(externalId)}`,
      repeatable: true,
      options,
    });
  }

  // ---- catalogue feeds ----------------------------------------------------------------------------------

  /**
   * POST /v1/collections/{c}/sync: makes the collection equal to a catalogue feed, run by the server as a job
   * (write key). Give the feed's `text` (CSV or JSON lines; `format` says which, else its first character
   * decides) or its `url` (fetched by the server, URL ingest on); photos are http(s) or data: URLs. A bad line
   * is refused (422, naming it) with nothing queued; a second sync while one runs is 409. Answers the queued
   * job; `waitSyncJob` follows it to its end.
   */
  syncFeed(collection: string, feed: SyncFeed, options?: WriteOptions): Promise<SyncJob> {
    const { text, url, format, captionFields, numberFields, ...rest } = feed;
    if ((text === undefined) === (url === undefined)) throw new TypeError("syncFeed needs the feed's text or its url, one of them");
    const query = {
      dry_run: rest.dryRun ? "true" : undefined,
      skip_failed: rest.skipFailed ? "true" : undefined,
      max_delete_share: rest.maxDeleteShare,
      id_field: rest.idField,
      image_field: rest.imageField,
      captions_field: rest.captionsField,
      caption_fields: captionFields?.join(","),
      number_fields: numberFields?.join(","),
    };
    const path = `/v1/collections/${seg(collection)}/sync`;
    const common = { method: "POST" as const, path, query, repeatable: false, write: true, idempotencyKey: options?.idempotencyKey, accept: [202], options };
    if (url !== undefined) return this.json({ ...common, json: { url } });
    const jsonl = format === "jsonl" || (format === undefined && text!.trimStart().startsWith("{"));
    return this.json({ ...common, body: text!, contentType: jsonl ? "application/x-ndjson" : "text/csv" });
  }

  /** GET /v1/collections/{c}/sync/{job}: the job's state, progress and, once finished, its report. */
  getSyncJob(collection: string, job: number, options?: CallOptions): Promise<SyncJob> {
    return this.json({ method: "GET", path: `/v1/collections/${seg(collection)}/sync/${seg(job)}`, repeatable: true, options });
  }

  /** Follows a sync job until it has `succeeded` or `failed`, polling every `pollMs`; the finished job. */
  async waitSyncJob(collection: string, job: number, pollMs = 500, options?: CallOptions): Promise<SyncJob> {
    for (;;) {
      const j = await this.getSyncJob(collection, job, options);
      if (j.state === "succeeded" || j.state === "failed") return j;
      await sleep(pollMs, options?.signal);
    }
  }

  /** GET .../images/{id}/thumbnail: the JPEG (longest side 256 px) as a Blob; 404 when the image has none. */
  async thumbnail(collection: string, id: number, options?: CallOptions): Promise<Blob> {
    const res = await this.send({
      method: "GET",
      path: `/v1/collections/${seg(collection)}/images/${seg(id)}/thumbnail`,
      repeatable: true,
      accept_header: "image/jpeg",
      options,
    });
    return res.blob();
  }

  // ---- captions ----------------------------------------------------------------------------------------

  /** POST /v1/collections/{c}/captions: captions of images (`image_id`) or standing alone; answers their ids. */
  async addCaptions(collection: string, captions: NewCaption[], options?: WriteOptions): Promise<number[]> {
    const r = await this.json<{ ids: number[] }>({
      method: "POST",
      path: `/v1/collections/${seg(collection)}/captions`,
      json: { captions },
      repeatable: false,
      write: true,
      idempotencyKey: options?.idempotencyKey,
      options,
    });
    return r.ids;
  }

  listCaptions(collection: string, options?: ListCaptionsOptions): Promise<CaptionList> {
    return this.json({
      method: "GET",
      path: `/v1/collections/${seg(collection)}/captions`,
      query: { offset: options?.offset, limit: options?.limit, image_id: options?.image_id },
      repeatable: true,
      options,
    });
  }

  async *listCaptionsIter(
    collection: string,
    options?: Omit<ListCaptionsOptions, "limit"> & IterOptions,
  ): AsyncGenerator<Caption, void, undefined> {
    const pageSize = options?.pageSize ?? 100;
    let offset = options?.offset ?? 0;
    let left = options?.max ?? Infinity;
    while (left > 0) {
      const page = await this.listCaptions(collection, { ...options, offset, limit: Math.min(pageSize, left) });
      for (const c of page.captions) yield c;
      left -= page.captions.length;
      offset += page.captions.length;
      if (page.captions.length === 0 || offset >= page.total) return;
    }
  }

  deleteCaption(collection: string, id: number, options?: CallOptions): Promise<void> {
    return this.none({ method: "DELETE", path: `/v1/collections/${seg(collection)}/captions/${seg(id)}`, repeatable: true, options });
  }

  // ---- search ------------------------------------------------------------------------------------------

  private async searchBody(query: SearchQuery): Promise<JsonObject> {
    const { image, ...rest } = query;
    const body: JsonObject = {};
    for (const [k, v] of Object.entries(rest)) if (v !== undefined) body[k] = v;
    if (image !== undefined && image !== null) body.image = await imageData(image, "a search");
    return body;
  }

  /**
   * POST /v1/collections/{c}/images/search: images for a sentence (`text`), a photo (`image`) or a stored image
   * (`image_id`, left out of its own results), with `k`, `offset`, `filter`, `mode`, `keyword_weight`, `min_score`.
   */
  async searchImages(collection: string, query: SearchQuery, options?: CallOptions): Promise<ImageResults> {
    return this.json({
      method: "POST",
      path: `/v1/collections/${seg(collection)}/images/search`,
      json: await this.searchBody(query),
      repeatable: true,
      options,
    });
  }

  /**
   * POST /v1/collections/{c}/captions/search: captions for a photo (annotation) or a stored image, or for a
   * sentence.
   */
  async searchCaptions(collection: string, query: SearchQuery, options?: CallOptions): Promise<CaptionResults> {
    return this.json({
      method: "POST",
      path: `/v1/collections/${seg(collection)}/captions/search`,
      json: await this.searchBody(query),
      repeatable: true,
      options,
    });
  }

  /** The captions of a collection that describe a photo best: searchCaptions by `image`. */
  annotate(collection: string, image: ImageInput, k = 5, options?: CallOptions): Promise<CaptionResults> {
    return this.searchCaptions(collection, { image, k }, options);
  }

  /**
   * Every result of an image search, page after page (`k` = pageSize, `offset` advancing), until a page comes
   * back short (the last one; `min_score` shortens only the last page, since results are cut in rank order)
   * or `max` results were yielded. A photo query is encoded once, not per page.
   */
  async *searchImagesIter(
    collection: string,
    query: SearchQuery,
    options?: CallOptions & IterOptions,
  ): AsyncGenerator<ImageResult, void, undefined> {
    yield* this.pages<ImageResult>(
      `/v1/collections/${seg(collection)}/images/search`,
      query,
      options,
      (r) => (r as ImageResults).results,
    );
  }

  /** Every result of a caption search, page after page (as searchImagesIter). */
  async *searchCaptionsIter(
    collection: string,
    query: SearchQuery,
    options?: CallOptions & IterOptions,
  ): AsyncGenerator<CaptionResult, void, undefined> {
    yield* this.pages<CaptionResult>(
      `/v1/collections/${seg(collection)}/captions/search`,
      query,
      options,
      (r) => (r as CaptionResults).results,
    );
  }

  private async *pages<T>(
    path: string,
    query: SearchQuery,
    options: (CallOptions & IterOptions) | undefined,
    results: (r: unknown) => T[],
  ): AsyncGenerator<T, void, undefined> {
    const body = await this.searchBody(query);
    const pageSize = options?.pageSize ?? query.k ?? 10;
    let offset = query.offset ?? 0;
    let left = options?.max ?? Infinity;
    while (left > 0) {
      const k = Math.min(pageSize, left);
      const page = results(
        await this.json({ method: "POST", path, json: { ...body, k, offset }, repeatable: true, options }),
      );
      for (const r of page) yield r;
      left -= page.length;
      offset += k;
      if (page.length < k) return;
    }
  }

  // ---- embed -------------------------------------------------------------------------------------------

  /** POST /v1/embed/text: one vector per sentence. */
  embedText(texts: string[], options?: CallOptions): Promise<EmbedTextResponse> {
    return this.json({ method: "POST", path: "/v1/embed/text", json: { texts }, repeatable: true, options });
  }

  /** POST /v1/embed/image: the photo's vector and its packed ternary FNE code. */
  async embedImage(image: ImageInput, options?: CallOptions): Promise<EmbedImageResponse> {
    return this.json({
      method: "POST",
      path: "/v1/embed/image",
      json: { image: await imageData(image, "embedImage") },
      repeatable: true,
      options,
    });
  }

  // ---- admin -------------------------------------------------------------------------------------------

  /** POST /v1/admin/reindex (admin key): every vector recomputed with the loaded bundle. */
  reindex(options?: WriteOptions): Promise<ReindexReport> {
    return this.json({
      method: "POST",
      path: "/v1/admin/reindex",
      repeatable: false,
      write: true,
      idempotencyKey: options?.idempotencyKey,
      options,
    });
  }

  /** POST /v1/admin/snapshot (admin key): the index snapshots written now. */
  snapshot(options?: WriteOptions): Promise<SnapshotReport> {
    return this.json({
      method: "POST",
      path: "/v1/admin/snapshot",
      repeatable: false,
      write: true,
      idempotencyKey: options?.idempotencyKey,
      options,
    });
  }
}
