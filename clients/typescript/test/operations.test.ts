// Every operation the client exposes, against the real server (test/server.ts), through the built package.
import assert from "node:assert/strict";
import { createServer, type Server as HttpServer } from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { JointspaceClient, NotFoundError, type ExportLine, type NewImage } from "@jointspace/client";
import { fixtures, photo, repo, startServer, uniqueName, type Server } from "./server.js";

const ADMIN = "ops-admin-key-0123456789";
let server: Server;
let photos: HttpServer;
let photosBase: string;
let js: JointspaceClient;

before(async () => {
  // A web server for URL ingest: the fixture photos under /p/, and 404 for anything else.
  photos = createServer((req, res) => {
    const m = /^\/p\/(fixture_\d\.png)$/.exec(req.url ?? "");
    if (!m) return res.writeHead(404).end("no such photo");
    res.writeHead(200, { "content-type": "image/png" }).end(readFileSync(join(fixtures, m[1]!)));
  });
  await new Promise<void>((ok) => photos.listen(0, "127.0.0.1", ok));
  const a = photos.address();
  photosBase = `http://127.0.0.1:${typeof a === "object" && a ? a.port : 0}`;
  server = await startServer({
    keys: [{ name: "admin", key: ADMIN, role: "admin" }],
    args: ["--url-ingest", "--url-ingest-allow", "127.0.0.1/32"],
  });
  js = new JointspaceClient({ baseUrl: server.base, apiKey: ADMIN });
});

after(async () => {
  const log = server?.log() ?? "";
  await server?.stop();
  photos?.closeAllConnections();
  await new Promise((ok) => photos?.close(ok));
  assert.doesNotMatch(log, /request failed/, "the server logged a server error");
});

describe("system", () => {
  test("health, readiness, bundle, metrics", async () => {
    assert.equal((await js.health()).status, "ok");
    const ready = await js.ready();
    assert.equal(ready.ready, true);
    assert.equal(ready.checks.database.ok, true);
    const bundle = await js.bundle();
    assert.ok(bundle.id.length > 0);
    assert.ok(["cosine", "order", "euclidean"].includes(bundle.similarity));
    assert.ok(bundle.joint_dim > 0);
    assert.match(await js.metrics(), /jointspace_/);
  });

  test("the served contract is the committed openapi.yaml, from which src/schema.ts is generated", async () => {
    assert.equal(await js.openapi(), readFileSync(join(repo, "openapi.yaml"), "utf8"));
  });
});

describe("collections", () => {
  test("create, get, list, delete", async () => {
    const name = uniqueName("coll");
    const fields = ["title", { field: "description", weight: 0.5 }];
    const made = await js.createCollection({ name, description: "a test", text_fields: fields });
    assert.equal(made.name, name);
    assert.equal(made.description, "a test");
    assert.deepEqual(made.text_fields, fields);
    assert.equal(made.images, 0);
    assert.equal((await js.getCollection(name)).name, name);
    assert.ok((await js.listCollections()).some((c) => c.name === name));
    await js.deleteCollection(name);
    await assert.rejects(js.getCollection(name), NotFoundError);
    assert.ok(!(await js.listCollections()).some((c) => c.name === name));
  });
});

describe("catalogue feeds", () => {
  test("syncFeed queues a job that waitSyncJob follows; a rerun changes nothing; a bad line is refused", async () => {
    const name = uniqueName("feed");
    await js.createCollection({ name });
    const csv = `id,title,image\nsku-1,Red shoe,${photosBase}/p/fixture_0.png\nsku-2,Blue bag,${photosBase}/p/fixture_1.png\n`;
    const job = await js.syncFeed(name, { text: csv });
    assert.ok(["queued", "running"].includes(job.state));
    const done = await js.waitSyncJob(name, job.id, 100);
    assert.equal(done.state, "succeeded", JSON.stringify(done));
    assert.equal(done.report?.added, 2);
    assert.equal(done.report?.photos_embedded, 2);
    const again = await js.waitSyncJob(name, (await js.syncFeed(name, { text: csv, format: "csv" })).id, 100);
    assert.equal(again.report?.unchanged, 2);
    const dry = await js.waitSyncJob(name, (await js.syncFeed(name, { text: csv.split("\n").slice(0, 2).join("\n"), dryRun: true, maxDeleteShare: 0.5 })).id, 100);
    assert.deepEqual(dry.report?.changes.map((c) => c.action), ["delete"]);
    assert.equal((await js.getCollection(name)).images, 2);
    await assert.rejects(js.syncFeed(name, { text: '{"id": "x"}' }), (e: Error) => /line 1: no `image`/.test(e.message));
    await js.deleteCollection(name);
  });
});

describe("images", () => {
  const c = uniqueName("imgs");
  before(() => js.createCollection({ name: c }));

  test("add from a Uint8Array, an ArrayBuffer, a Blob, a File, base64 and a data: URL, with metadata and captions", async () => {
    const b64 = Buffer.from(photo(3)).toString("base64");
    const ab = photo(1).slice().buffer;
    const inputs: NewImage[] = [
      { image: photo(0), external_id: "u8", metadata: { color: "red", price: 10 }, captions: ["a red thing"] },
      { image: ab, external_id: "ab", metadata: { color: "blue", price: 20 } },
      { image: new Blob([photo(2)], { type: "image/png" }), external_id: "blob", metadata: { color: "red", price: 30 } },
      { image: new File([photo(4)], "four.png", { type: "image/png" }), external_id: "file" },
      { image: b64, external_id: "b64", captions: ["grey squares", "a second caption"] },
      { image: `data:image/png;base64,${Buffer.from(photo(5)).toString("base64")}`, external_id: "dataurl" },
    ];
    const r = await js.addImages(c, inputs);
    assert.equal(r.errors, undefined);
    assert.deepEqual(r.images.map((i) => i.index), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(r.images.map((i) => i.external_id), ["u8", "ab", "blob", "file", "b64", "dataurl"]);
    assert.deepEqual([r.images[0]!.width, r.images[0]!.height], [224, 224]);
    assert.deepEqual([r.images[1]!.width, r.images[1]!.height], [320, 200]);
    assert.equal(r.images[0]!.caption_ids.length, 1);
    assert.equal(r.images[4]!.caption_ids.length, 2);
    const img = await js.getImage(c, r.images[0]!.id);
    assert.deepEqual(img.metadata, { color: "red", price: 10 });
    assert.deepEqual(img.captions?.map((x) => x.text), ["a red thing"]);
    assert.equal((await js.getImageByExternalId(c, "b64")).id, r.images[4]!.id);
    assert.equal((await js.getCollection(c)).images, 6);
  });

  test("addImage: one image", async () => {
    const one = await js.addImage(c, { image: photo(6), external_id: "shoes/sku-9", metadata: { color: "green" } });
    // An external id with "/" travels percent-encoded.
    assert.equal((await js.getImageByExternalId(c, "shoes/sku-9")).id, one.id);
  });

  test("add by URL (server-side fetch): a URL object and an http string; a dead URL is listed in errors", async () => {
    const r = await js.addImages(c, [
      { image: new URL(`${photosBase}/p/fixture_7.png`), external_id: "url-obj" },
      { image: `${photosBase}/p/fixture_0.png`, external_id: "url-str", captions: ["from the web"] },
      { image: `${photosBase}/p/missing.png`, external_id: "url-dead" },
    ]);
    assert.deepEqual(r.images.map((i) => [i.index, i.external_id]), [[0, "url-obj"], [1, "url-str"]]);
    assert.deepEqual([r.images[0]!.width, r.images[0]!.height], [640, 480]);
    assert.equal(r.errors?.length, 1);
    assert.equal(r.errors![0]!.index, 2);
    assert.equal(r.errors![0]!.code, "url_status");
    await assert.rejects(js.getImageByExternalId(c, "url-dead"), NotFoundError);
  });

  test("list with a filter and by external id, and page through with listImagesIter", async () => {
    const red = await js.listImages(c, { filter: { color: "red" } });
    assert.equal(red.total, 2);
    assert.deepEqual(red.images.map((i) => i.external_id).sort(), ["blob", "u8"]);
    const cheap = await js.listImages(c, { filter: { price: { $lt: 25 } }, limit: 1 });
    assert.equal(cheap.total, 2);
    assert.equal(cheap.images.length, 1);
    const byExt = await js.listImages(c, { external_id: "file" });
    assert.deepEqual(byExt.images.map((i) => i.external_id), ["file"]);
    const total = (await js.listImages(c, { limit: 1 })).total;
    const all = [];
    for await (const im of js.listImagesIter(c, { pageSize: 2 })) all.push(im.id);
    assert.equal(all.length, total);
    assert.equal(new Set(all).size, total);
    const capped = [];
    for await (const im of js.listImagesIter(c, { pageSize: 2, max: 3 })) capped.push(im.id);
    assert.deepEqual(capped, all.slice(0, 3));
  });

  test("patch: merge metadata, set and clear the external id", async () => {
    const { id } = await js.getImageByExternalId(c, "u8");
    const p = await js.patchImage(c, id, { metadata: { price: 12.5, color: null, size: { w: 1 } }, external_id: "u8-new" });
    assert.deepEqual(p.metadata, { price: 12.5, size: { w: 1 } });
    assert.equal(p.external_id, "u8-new");
    const q = await js.patchImage(c, id, { metadata: { size: { h: 2 } }, external_id: null });
    assert.deepEqual(q.metadata, { price: 12.5, size: { w: 1, h: 2 } });
    assert.equal(q.external_id ?? null, null);
    await js.patchImage(c, id, { external_id: "u8" });
  });

  test("upsert by external id: created, updated (same photo, same id), replaced (new photo, new id)", async () => {
    const made = await js.upsertImage(c, "sku-up", { image: photo(0), metadata: { v: 1 }, captions: ["first"] });
    assert.equal(made.outcome, "created");
    const same = await js.upsertImage(c, "sku-up", {
      image: new Blob([photo(0)]),
      metadata: { v: 2 },
      captions: ["first", "second"],
    });
    assert.equal(same.outcome, "updated");
    assert.equal(same.id, made.id);
    assert.equal(same.caption_ids[0], made.caption_ids[0], "a caption sent again keeps its id");
    const img = await js.getImage(c, same.id);
    assert.deepEqual(img.metadata, { v: 2 });
    const repl = await js.upsertImage(c, "sku-up", { image: photo(1) });
    assert.equal(repl.outcome, "replaced");
    assert.equal(repl.previous_id, made.id);
    assert.notEqual(repl.id, made.id);
    await assert.rejects(js.getImage(c, made.id), NotFoundError);
    assert.deepEqual((await js.getImage(c, repl.id)).metadata, {});
  });

  test("thumbnail: a JPEG", async () => {
    const { id } = await js.getImageByExternalId(c, "file");
    const t = await js.thumbnail(c, id);
    const b = new Uint8Array(await t.arrayBuffer());
    assert.deepEqual([b[0], b[1]], [0xff, 0xd8]);
    assert.equal(t.type, "image/jpeg");
  });

  test("delete by id and by external id", async () => {
    const a = await js.addImage(c, { image: photo(2), external_id: "del-1" });
    await js.addImage(c, { image: photo(2), external_id: "del-2" });
    await js.deleteImage(c, a.id);
    await assert.rejects(js.getImage(c, a.id), NotFoundError);
    await js.deleteImageByExternalId(c, "del-2");
    await assert.rejects(js.getImageByExternalId(c, "del-2"), NotFoundError);
    await assert.rejects(js.deleteImage(c, a.id), NotFoundError);
  });
});

describe("captions", () => {
  const c = uniqueName("caps");
  let imageId = 0;
  before(async () => {
    await js.createCollection({ name: c });
    imageId = (await js.addImage(c, { image: photo(0) })).id;
  });

  test("add (of an image and alone), list, page, delete", async () => {
    const ids = await js.addCaptions(c, [
      { text: "a dog on a beach", image_id: imageId },
      { text: "a cat on a sofa" },
      { text: "two children playing" },
    ]);
    assert.equal(ids.length, 3);
    const ofImage = await js.listCaptions(c, { image_id: imageId });
    assert.deepEqual(ofImage.captions.map((x) => x.text), ["a dog on a beach"]);
    const all = await js.listCaptions(c);
    assert.equal(all.total, 3);
    const seen = [];
    for await (const cap of js.listCaptionsIter(c, { pageSize: 2 })) seen.push(cap.id);
    assert.deepEqual(seen.sort(), [...ids].sort());
    await js.deleteCaption(c, ids[1]!);
    assert.equal((await js.listCaptions(c)).total, 2);
    await assert.rejects(js.deleteCaption(c, ids[1]!), NotFoundError);
  });
});

describe("search", () => {
  const c = uniqueName("search");
  const ids: number[] = [];
  before(async () => {
    await js.createCollection({ name: c, text_fields: ["title"] });
    const r = await js.addImages(
      c,
      [0, 1, 2, 3, 4, 5, 6, 7].map((n) => ({
        image: photo(n),
        external_id: `p${n}`,
        metadata: { n, even: n % 2 === 0, title: n === 5 ? "zanzibar espadrille" : `photo ${n}` },
        captions: [`picture number ${n}`],
      })),
    );
    ids.push(...r.images.map((i) => i.id));
  });

  test("by sentence: k, offset pages, scores ordered", async () => {
    const r = await js.searchImages(c, { text: "a dog running on the beach", k: 8, mode: "vector" });
    assert.equal(r.mode, "vector");
    assert.equal(r.results.length, 8);
    const scores = r.results.map((x) => x.score);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
    const p2 = await js.searchImages(c, { text: "a dog running on the beach", k: 3, offset: 3, mode: "vector" });
    assert.deepEqual(p2.results.map((x) => x.image.id), r.results.slice(3, 6).map((x) => x.image.id));
  });

  test("filter and matches; min_score", async () => {
    const r = await js.searchImages(c, { text: "a photo", k: 10, filter: { even: true } });
    assert.equal(r.matches, 4);
    assert.equal(r.results.length, 4);
    assert.ok(r.results.every((x) => (x.image.metadata as { n: number }).n % 2 === 0));
    const all = await js.searchImages(c, { text: "a photo", k: 8, mode: "vector" });
    const cut = all.results[2]!.score;
    const r2 = await js.searchImages(c, { text: "a photo", k: 8, mode: "vector", min_score: cut });
    assert.deepEqual(r2.results.map((x) => x.image.id), all.results.filter((x) => x.score >= cut).map((x) => x.image.id));
    assert.ok(r2.results.length < 8);
  });

  test("mode and keyword_weight: a word the model does not know finds its product by keyword", async () => {
    const kw = await js.searchImages(c, { text: "zanzibar", k: 3, mode: "keyword" });
    assert.equal(kw.mode, "keyword");
    assert.equal(kw.results[0]!.image.external_id, "p5");
    const hy = await js.searchImages(c, { text: "zanzibar", k: 3, keyword_weight: 1 });
    assert.equal(hy.mode, "hybrid", "a collection with text_fields defaults to hybrid");
    assert.equal(hy.results[0]!.image.external_id, "p5");
    const vec = await js.searchImages(c, { text: "zanzibar", k: 8, mode: "vector" });
    assert.equal(vec.mode, "vector");
    assert.ok(vec.unknown_words.includes("zanzibar"));
  });

  test("products with several photos: each once, its photos listed; group: false for photos", async () => {
    const g = uniqueName("products");
    const made = await js.createCollection({ name: g, text_fields: ["title"], group_by: "product_id" });
    assert.equal(made.group_by, "product_id");
    const r = await js.addImages(g, [
      { image: photo(0), external_id: "p1", metadata: { product_id: "p1", title: "zanzibar espadrille" } },
      { image: photo(1), external_id: "p1~2", metadata: { product_id: "p1" } },
      { image: photo(2), external_id: "p2", metadata: { product_id: "p2", title: "loafer" } },
    ]);
    const found = await js.searchImages(g, { text: "a photo of a shoe", k: 10 });
    assert.deepEqual(found.results.map((x) => x.product?.key).sort(), ["p1", "p2"]);
    const first = found.results.find((x) => x.product?.key === "p1")!;
    assert.equal(first.product?.photos[0], first.image.id);
    assert.deepEqual([...first.product!.photos].sort((a, b) => a - b), r.images.slice(0, 2).map((i) => i.id).sort((a, b) => a - b));
    const photos = await js.searchImages(g, { text: "a photo of a shoe", k: 10, group: false });
    assert.equal(photos.results.length, 3);
    await js.deleteCollection(g);
  });

  test("by photo (Blob) and by stored id (left out of its own results)", async () => {
    const byPhoto = await js.searchImages(c, { image: new Blob([photo(4)]), k: 1 });
    assert.equal(byPhoto.results[0]!.image.id, ids[4], "a stored photo is its own nearest neighbour");
    const similar = await js.searchImages(c, { image_id: ids[4]!, k: 8 });
    assert.equal(similar.results.length, 7);
    assert.ok(!similar.results.some((x) => x.image.id === ids[4]));
  });

  test("searchImagesIter: every result once, in the order of one big page", async () => {
    const big = await js.searchImages(c, { text: "a picture", k: 8, mode: "vector" });
    const seen = [];
    for await (const r of js.searchImagesIter(c, { text: "a picture", mode: "vector" }, { pageSize: 3 })) seen.push(r.image.id);
    assert.deepEqual(seen, big.results.map((x) => x.image.id));
    const capped = [];
    for await (const r of js.searchImagesIter(c, { text: "a picture", mode: "vector" }, { pageSize: 3, max: 4 })) capped.push(r.image.id);
    assert.deepEqual(capped, seen.slice(0, 4));
    const filtered = [];
    for await (const r of js.searchImagesIter(c, { text: "a picture", filter: { even: false } }, { pageSize: 1 })) filtered.push(r);
    assert.equal(filtered.length, 4);
  });

  test("captions: annotate a photo, search by sentence, page with searchCaptionsIter", async () => {
    const ann = await js.annotate(c, photo(3), 3);
    assert.equal(ann.results.length, 3);
    assert.ok(ann.results.every((x) => x.caption.text.startsWith("picture number")));
    const byText = await js.searchCaptions(c, { text: "picture number 6", k: 8 });
    assert.equal(byText.results.length, 8);
    const byId = await js.searchCaptions(c, { image_id: ids[0]!, k: 2 });
    assert.equal(byId.results.length, 2);
    // Caption search also finds each product's title, a sentence of its text field (tagged with the field).
    const seen = [];
    const fields = [];
    for await (const r of js.searchCaptionsIter(c, { text: "picture" }, { pageSize: 3 })) {
      if (r.caption.field) fields.push(r.caption.field);
      else seen.push(r.caption.id);
    }
    assert.equal(seen.length, 8);
    assert.equal(new Set(seen).size, 8);
    assert.ok(fields.length > 0 && fields.every((f) => f === "title"), `${fields}`);
  });
});

describe("embed", () => {
  test("text: one unit vector per sentence", async () => {
    const r = await js.embedText(["a dog", "a cat on a sofa"]);
    assert.equal(r.embeddings.length, 2);
    assert.equal(r.embeddings[0]!.length, r.dim);
    const norm = Math.hypot(...r.embeddings[0]!);
    assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
  });

  test("image: a vector and its packed code", async () => {
    const r = await js.embedImage(photo(7));
    assert.equal(r.embedding.length, r.dim);
    assert.deepEqual([r.width, r.height], [640, 480]);
    assert.ok(r.code.packed.length > 0);
    assert.equal(r.code.plus + r.code.minus <= r.code.dim, true);
    await assert.rejects(js.embedImage(new URL("https://example.com/x.jpg")), TypeError);
  });
});

describe("export and import", () => {
  test("export streams header, images, loose captions and end; importImages adds in batches", async () => {
    const c = uniqueName("xfer");
    await js.createCollection({ name: c, description: "to export" });
    await js.addImages(c, [
      { image: photo(0), external_id: "a", metadata: { k: 1 }, captions: ["one"] },
      { image: photo(1), external_id: "b" },
    ]);
    await js.addCaptions(c, [{ text: "alone" }]);
    const lines: ExportLine[] = [];
    for await (const line of js.exportCollection(c)) lines.push(line);
    assert.equal(lines.length, 5);
    const [head, ...rest] = lines;
    assert.ok(head && "header" in head);
    assert.equal(head.header.collection, c);
    assert.equal(head.header.description, "to export");
    const images = rest.flatMap((l) => ("image" in l ? [l.image] : []));
    assert.deepEqual(images.map((i) => i.external_id).sort(), ["a", "b"]);
    const a = images.find((i) => i.external_id === "a")!;
    assert.deepEqual(a.metadata, { k: 1 });
    assert.deepEqual(a.captions, ["one"]);
    assert.ok(a.code.length > 0);
    assert.deepEqual(rest.flatMap((l) => ("caption" in l ? [l.caption.text] : [])), ["alone"]);
    assert.deepEqual(lines.at(-1), { end: { images: 2, captions: 1 } });

    const target = uniqueName("imported");
    await js.createCollection({ name: target });
    async function* catalogue() {
      for (const n of [0, 1, 2, 3, 4]) yield { image: photo(n), external_id: `cat-${n}`, metadata: { n } };
      yield { image: `${photosBase}/p/nothing-here.png`, external_id: "cat-dead" };
    }
    const batches: number[] = [];
    const r = await js.importImages(target, catalogue(), { batchSize: 2, onBatch: (b) => batches.push(b.added) });
    assert.deepEqual(batches, [2, 2, 1], "three requests: 2, 2, and 1 stored beside the dead URL");
    assert.equal(r.errors.length, 1);
    assert.deepEqual([r.errors[0]!.index, r.errors[0]!.code], [5, "url_status"]);
    assert.deepEqual(r.images.map((i) => i.index), [0, 1, 2, 3, 4]);
    assert.deepEqual(r.images.map((i) => i.external_id), ["cat-0", "cat-1", "cat-2", "cat-3", "cat-4"]);
    assert.equal((await js.getCollection(target)).images, 5);
  });
});

describe("admin", () => {
  test("snapshot and reindex", async () => {
    const s = await js.snapshot();
    assert.ok(s.indexes >= 2);
    const r = await js.reindex();
    assert.equal(r.resumed, 0);
    assert.ok(r.images >= 0 && r.captions >= 0);
  });
});
