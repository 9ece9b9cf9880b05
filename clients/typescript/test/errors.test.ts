// The failure paths, against the real server: each refusal arrives as its JointspaceError subclass with the
// API's status, code and message; 429 is retried after Retry-After within the budget; idempotency keys make
// a write's retry safe.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  BadRequestError,
  ConflictError,
  ConnectionError,
  ForbiddenError,
  JointspaceClient,
  JointspaceError,
  NotFoundError,
  PayloadTooLargeError,
  RateLimitedError,
  UnauthorizedError,
  UnprocessableError,
  parseRetryAfter,
  type RetryInfo,
} from "@jointspace/client";
import { freePort, photo, startServer, uniqueName, type Server } from "./server.js";

const ADMIN = "err-admin-key-0123456789";
const READ = "err-read-key-0123456789";
const WRITE = "err-write-key-0123456789";
const TENANT = "err-tenant-key-0123456789";
const ORIGIN = "http://page.example";
let server: Server;
let admin: JointspaceClient;
const c = uniqueName("errs");
const tenantCollection = uniqueName("tenant");

/** A key of its own for each rate-limit test, so that one test's bucket never holds up another's. */
const limited = (name: string, rps: number) => ({
  name,
  key: `err-${name}-key-0123456789`,
  role: "write" as const,
  requests_per_second: rps,
  burst: 1,
});
const RL = {
  retry: limited("rl-retry", 1),
  write: limited("rl-write", 1),
  time: limited("rl-time", 0.2),
  attempts: limited("rl-attempts", 0.2),
  abort: limited("rl-abort", 0.2),
};

function client(apiKey: string | undefined, more: Partial<ConstructorParameters<typeof JointspaceClient>[0]> = {}) {
  return new JointspaceClient({ baseUrl: server.base, apiKey, ...more });
}

before(async () => {
  server = await startServer({
    keys: [
      { name: "admin", key: ADMIN, role: "admin" },
      { name: "viewer", key: READ, role: "read" },
      { name: "writer", key: WRITE, role: "write" },
      { name: "tenant", key: TENANT, role: "write", collections: [tenantCollection] },
      ...Object.values(RL),
    ],
    // A 1 MiB body limit and a 40,000-byte image limit, so that both 413s come from small requests
    // (fixture_7.png is 52,528 bytes; the others fit).
    args: ["--max-request-bytes", "1048576", "--max-image-bytes", "40000", "--cors-origins", ORIGIN],
  });
  admin = client(ADMIN);
  await admin.createCollection({ name: c });
  await admin.createCollection({ name: tenantCollection });
});

after(async () => {
  const log = server?.log() ?? "";
  await server?.stop();
  assert.doesNotMatch(log, /request failed/, "the server logged a server error");
});

/** Awaits a rejection and checks its class, status and code; answers the error. */
async function refused<E extends JointspaceError>(
  p: Promise<unknown>,
  Class: new (...a: never[]) => E,
  status: number,
  code: string,
): Promise<E> {
  const e = await p.then(
    () => assert.fail(`expected ${Class.name} (${status} ${code}), got a success`),
    (err: unknown) => err,
  );
  assert.ok(e instanceof Class, `expected ${Class.name}, got ${String(e)}`);
  assert.ok(e instanceof JointspaceError);
  assert.equal(e.status, status);
  assert.equal(e.code, code, e.message);
  assert.ok(e.message.length > 0);
  return e;
}

describe("refusals carry status, code and message", () => {
  test("404 not_found: collection, image, caption", async () => {
    const e = await refused(admin.getCollection("no-such-collection"), NotFoundError, 404, "not_found");
    assert.equal(e.attempts, 1);
    assert.equal(e.method, "GET");
    assert.match(e.url, /\/v1\/collections\/no-such-collection$/);
    await refused(admin.getImage(c, 987654), NotFoundError, 404, "not_found");
    await refused(admin.deleteCaption(c, 987654), NotFoundError, 404, "not_found");
    await refused(admin.searchImages("no-such-collection", { text: "a dog" }), NotFoundError, 404, "not_found");
  });

  test("409 conflict: a collection name taken, an external id taken (on add and on patch)", async () => {
    await refused(admin.createCollection({ name: c }), ConflictError, 409, "conflict");
    const first = await admin.addImage(c, { image: photo(0), external_id: "taken" });
    const e = await refused(admin.addImage(c, { image: photo(1), external_id: "taken" }), ConflictError, 409, "conflict");
    assert.match(e.message, /taken/);
    const other = await admin.addImage(c, { image: photo(1) });
    await refused(admin.patchImage(c, other.id, { external_id: "taken" }), ConflictError, 409, "conflict");
    assert.equal((await admin.getImageByExternalId(c, "taken")).id, first.id);
  });

  test("413: a body over --max-request-bytes (payload_too_large), an image over --max-image-bytes (invalid_image)", async () => {
    const big = new Uint8Array(1_200_000).map((_, i) => (i * 7919) & 0xff);
    const e = await refused(admin.addImage(c, { image: big }), PayloadTooLargeError, 413, "payload_too_large");
    assert.match(e.message, /1048576/, "the message states the limit");
    assert.equal(e.attempts, 1, "a 413 is not retried");
    const i = await refused(admin.addImage(c, { image: photo(7) }), PayloadTooLargeError, 413, "invalid_image");
    assert.match(i.message, /40000/);
  });

  test("401 unauthorized: no key, an unknown key", async () => {
    await refused(client(undefined).listCollections(), UnauthorizedError, 401, "unauthorized");
    await refused(client("not-a-key-of-this-server").getCollection(c), UnauthorizedError, 401, "unauthorized");
  });

  test("403 forbidden: a read key writing, a write key creating a collection, a tenant outside its collections", async () => {
    const viewer = client(READ);
    assert.ok((await viewer.listCollections()).length >= 2, "the read key reads");
    await refused(viewer.addImage(c, { image: photo(0) }), ForbiddenError, 403, "forbidden");
    await refused(viewer.createCollection({ name: uniqueName("nope") }), ForbiddenError, 403, "forbidden");
    await refused(client(WRITE).createCollection({ name: uniqueName("nope") }), ForbiddenError, 403, "forbidden");
    await refused(client(WRITE).snapshot(), ForbiddenError, 403, "forbidden");
    const tenant = client(TENANT);
    await tenant.addImage(tenantCollection, { image: photo(2) });
    await refused(tenant.listImages(c), ForbiddenError, 403, "forbidden");
    assert.deepEqual((await tenant.listCollections()).map((x) => x.name), [tenantCollection]);
  });

  test("400 and 422: an id that is not a number, k out of range, a bad filter, keyword mode on a photo", async () => {
    await refused(admin.getImage(c, Number.NaN), BadRequestError, 400, "bad_request");
    await refused(admin.searchImages(c, { text: "a dog", k: 0 }), UnprocessableError, 422, "invalid");
    const f = await refused(
      admin.searchImages(c, { text: "a dog", filter: { price: { $gtx: 1 } } }),
      UnprocessableError,
      422,
      "invalid_filter",
    );
    assert.match(f.message, /\$gtx/);
    await refused(admin.embedText([""]), UnprocessableError, 422, "invalid_text");
  });
});

describe("idempotency keys", () => {
  test("the same key and body: the first answer again, stored once", async () => {
    const col = uniqueName("idem");
    await admin.createCollection({ name: col });
    const key = `test-${crypto.randomUUID()}`;
    const a = await admin.addImages(col, [{ image: photo(0), captions: ["once"] }], { idempotencyKey: key });
    const b = await admin.addImages(col, [{ image: photo(0), captions: ["once"] }], { idempotencyKey: key });
    assert.deepEqual(b, a);
    assert.equal((await admin.getCollection(col)).images, 1);
    assert.equal((await admin.getCollection(col)).captions, 1);
  });

  test("422 idempotency_key_reused: the same key with another body", async () => {
    const key = `test-${crypto.randomUUID()}`;
    await admin.addCaptions(c, [{ text: "first body" }], { idempotencyKey: key });
    const e = await refused(
      admin.addCaptions(c, [{ text: "another body" }], { idempotencyKey: key }),
      UnprocessableError,
      422,
      "idempotency_key_reused",
    );
    assert.equal(e.attempts, 1);
  });

  test("two sends at once with one key: one write, both get its answer (a 409 in flight is waited out)", async () => {
    const col = uniqueName("race");
    await admin.createCollection({ name: col });
    const key = `test-${crypto.randomUUID()}`;
    const batch = [0, 1, 2, 3, 4, 5].map((n) => ({ image: photo(n), external_id: `r${n}` }));
    const retries: RetryInfo[] = [];
    const racer = client(ADMIN, { retry: { onRetry: (r) => retries.push(r) } });
    const [a, b] = await Promise.all([
      racer.addImages(col, batch, { idempotencyKey: key }),
      racer.addImages(col, batch, { idempotencyKey: key }),
    ]);
    assert.deepEqual(a, b);
    assert.equal((await admin.getCollection(col)).images, 6);
    assert.ok(retries.every((r) => r.error.code === "idempotency_in_flight"), JSON.stringify(retries.map((r) => r.error.code)));
  });

  test("every write call sends a fresh key of its own: the same call twice stores twice", async () => {
    const col = uniqueName("fresh");
    await admin.createCollection({ name: col });
    await admin.addCaptions(col, [{ text: "same" }]);
    await admin.addCaptions(col, [{ text: "same" }]);
    assert.equal((await admin.listCaptions(col)).total, 2);
  });
});

describe("retries", () => {
  test("a 429 is retried after Retry-After, then succeeds", async () => {
    const retries: RetryInfo[] = [];
    const js = client(RL.retry.key, { retry: { onRetry: (r) => retries.push(r) } });
    await js.listCollections();
    const t0 = Date.now();
    const list = await js.listCollections();
    const took = Date.now() - t0;
    assert.ok(Array.isArray(list));
    assert.equal(retries.length, 1);
    const r = retries[0]!;
    assert.ok(r.error instanceof RateLimitedError);
    assert.equal(r.error.code, "rate_limited");
    assert.equal(r.error.retryAfter, 1);
    assert.equal(r.delayMs, 1000, "the wait is the server's Retry-After");
    assert.ok(took >= 950, `waited ${took} ms`);
  });

  test("a rate-limited write is retried with its idempotency key and stored once", async () => {
    const col = uniqueName("rlw");
    await admin.createCollection({ name: col });
    const retries: RetryInfo[] = [];
    const js = client(RL.write.key, { retry: { onRetry: (r) => retries.push(r) } });
    await js.addImage(col, { image: photo(0), external_id: "w0" });
    await js.addImage(col, { image: photo(1), external_id: "w1" });
    assert.equal(retries.length, 1);
    assert.equal(retries[0]!.error.status, 429);
    assert.equal((await admin.getCollection(col)).images, 2);
  });

  test("budget in time: a Retry-After past maxTotalMs throws at once, without waiting", async () => {
    const js = client(RL.time.key, { retry: { maxTotalMs: 2000 } });
    await js.listCollections();
    const t0 = Date.now();
    const e = await refused(js.listCollections(), RateLimitedError, 429, "rate_limited");
    assert.ok(Date.now() - t0 < 1000, "no pointless sleep");
    assert.equal(e.attempts, 1);
    assert.ok(e.retryAfter! >= 2, `Retry-After ${e.retryAfter}`);
  });

  test("budget in attempts: maxAttempts 1 (or retry: false) throws the 429", async () => {
    const js = client(RL.attempts.key, { retry: { maxAttempts: 1 } });
    await js.listCollections();
    const e = await refused(js.listCollections(), RateLimitedError, 429, "rate_limited");
    assert.equal(e.attempts, 1);
    await refused(client(RL.attempts.key, { retry: false }).listCollections(), RateLimitedError, 429, "rate_limited");
  });

  test("the caller's AbortSignal ends a retry's wait", async () => {
    const js = client(RL.abort.key);
    await js.listCollections();
    const t0 = Date.now();
    await assert.rejects(js.listCollections({ signal: AbortSignal.timeout(200) }), (e: unknown) => {
      assert.ok(e instanceof DOMException, String(e));
      assert.equal(e.name, "TimeoutError");
      return true;
    });
    assert.ok(Date.now() - t0 < 2000);
  });

  test("no answer: reads are retried to the attempt budget; a write without a key is sent once", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const seen: RetryInfo[] = [];
    const js = new JointspaceClient({ baseUrl: dead, retry: { maxAttempts: 3, baseDelayMs: 5, onRetry: (r) => seen.push(r) } });
    const e = await refused(js.listCollections(), ConnectionError, 0, "connection_error");
    assert.equal(e.attempts, 3);
    assert.equal(seen.length, 2);
    const keyed = await refused(js.addCaptions("x", [{ text: "t" }]), ConnectionError, 0, "connection_error");
    assert.equal(keyed.attempts, 3, "a keyed write may be sent again");
    const unkeyed = new JointspaceClient({ baseUrl: dead, idempotencyKeys: false, retry: { maxAttempts: 3, baseDelayMs: 5 } });
    const once = await refused(unkeyed.addCaptions("x", [{ text: "t" }]), ConnectionError, 0, "connection_error");
    assert.equal(once.attempts, 1, "a write without a key is never sent twice");
  });

  test("timeoutMs: an attempt past it is abandoned", async () => {
    const js = client(ADMIN, { timeoutMs: 1, retry: false });
    await refused(js.embedImage(photo(4)), ConnectionError, 0, "timeout");
  });

  test("parseRetryAfter: seconds and an HTTP date", () => {
    assert.equal(parseRetryAfter("3"), 3000);
    assert.equal(parseRetryAfter(null), undefined);
    assert.equal(parseRetryAfter("soon"), undefined);
    const now = Date.parse("Wed, 21 Oct 2015 07:28:00 GMT");
    assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:28:05 GMT", now), 5000);
  });
});

describe("browsers", () => {
  test("CORS lets a page send the client's headers and read Retry-After", async () => {
    const pre = await fetch(`${server.base}/v1/collections/${c}/images`, {
      method: "OPTIONS",
      headers: {
        origin: ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type,idempotency-key",
      },
    });
    assert.equal(pre.status, 200);
    assert.equal(pre.headers.get("access-control-allow-origin"), ORIGIN);
    const allowed = (pre.headers.get("access-control-allow-headers") ?? "").toLowerCase();
    for (const h of ["authorization", "content-type", "idempotency-key"]) assert.ok(allowed.includes(h), allowed);
    const r = await fetch(`${server.base}/v1/collections`, { headers: { origin: ORIGIN, authorization: `Bearer ${ADMIN}` } });
    assert.match((r.headers.get("access-control-expose-headers") ?? "").toLowerCase(), /retry-after/);
  });
});
